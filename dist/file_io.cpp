// Regular-file checks for untrusted inputs and the one atomic writer (see file_io.h).
#include "dist/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dist/error.h"

namespace ac {
namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

void require_regular_file(const std::string& path, const std::string& field) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw InputError(path, field, std::string("cannot open: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw InputError(path, field, std::string("is ") + kind_of(st.st_mode) + ", not a regular file");
}

std::string read_regular_file(const std::string& path, const std::string& field, uint64_t max_bytes) {
  require_regular_file(path, field);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, field, std::string("cannot open: ") + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) throw InputError(path, field, "cannot determine the file size");
  if (uint64_t(size) > max_bytes)
    throw InputError(path, field, "file is " + std::to_string(size) + " bytes, more than the " + std::to_string(max_bytes) + " this reader accepts");
  in.seekg(0);
  std::string s(size_t(size), '\0');
  in.read(s.data(), size);
  if (in.gcount() != size) throw InputError(path, field, "short read");
  return s;
}

void check_output_path(const std::string& path, const std::string& field) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // absent (or a dangling link): may be created
  if (!S_ISREG(st.st_mode))
    throw InputError(path, field, std::string("exists and is ") + kind_of(st.st_mode) + "; refusing to replace it with a file");
}

void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write, const std::string& field) {
  namespace fs = std::filesystem;
  check_output_path(path, field);
  std::error_code ec;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp";
  struct stat st {};
  if (::lstat(tmp.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw InputError(tmp, field, "exists and is a directory; cannot write the temporary file");
    ::unlink(tmp.c_str());  // a stale temporary (or a FIFO planted there): never opened
  }
  auto fail = [&](const std::string& what, int err) {
    ::unlink(tmp.c_str());
    throw std::runtime_error(tmp + ": " + what + (err ? std::string(": ") + std::strerror(err) : std::string()));
  };
  {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int err = errno;
      throw InputError(path, field, "cannot create " + tmp + ": " + std::strerror(err));
    }
    ::close(fd);
  }
  try {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot open for writing", errno);
    errno = 0;
    write(out);
    out.flush();
    if (!out) fail("write failed", errno);
    out.close();
    if (out.fail()) fail("write failed on close", errno);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot reopen to sync", errno);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail("fsync failed", err);
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename to " + path, errno);
}

void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& field) {
  write_file_atomic(path, [&](std::ostream& out) { out.write(bytes.data(), std::streamsize(bytes.size())); }, field);
}

}  // namespace ac
