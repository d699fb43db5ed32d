// open_token_source: picks the reader from the path.
#include "data/token_source.h"

#include "data/hdf5_store.h"
#include "data/indexed_dataset.h"

namespace ac::data {

std::shared_ptr<TokenSource> open_token_source(const std::string& path) {
  if (is_hdf5_path(path)) return std::make_shared<Hdf5TokenStore>(path);
  return std::make_shared<IndexedDataset>(path);
}

}  // namespace ac::data
