// Untrusted files in, outputs out: the checks every reader and writer of user-named paths
// shares. Inputs must be regular files (a FIFO or device would block or never end); outputs
// are written to PATH.tmp and renamed over PATH, never over a device, FIFO or directory, and
// a failed write is an error that leaves no .tmp behind.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>

namespace ac {

// Throws InputError(path, field, ...) unless `path` is an existing regular file (symlinks
// followed). Call it before opening a file a user or another file named.
void require_regular_file(const std::string& path, const std::string& field = "file");

// The whole content of a regular file of at most `max_bytes` bytes (InputError otherwise).
std::string read_regular_file(const std::string& path, const std::string& field = "file",
                              uint64_t max_bytes = uint64_t(1) << 31);

// Throws InputError(path, field, ...) when `path` exists and is not a regular file (a
// device, FIFO, socket or directory): an output may replace a file, nothing else.
void check_output_path(const std::string& path, const std::string& field = "output");

// Writes PATH.tmp through `write`, flushes and fsyncs it, and renames it over PATH. Refuses a
// PATH that is not a regular file (check_output_path); a write, flush, fsync or rename that
// fails throws std::runtime_error naming the file and removes PATH.tmp, as does an exception
// from `write`. Creates PATH's parent directories.
void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write,
                       const std::string& field = "output");
void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& field = "output");

}  // namespace ac
