// Sampling: windows across document boundaries, determinism, document splits, DP
// disjointness, exact resume (same and different DP size), blend proportions, cursors.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "data/hdf5_store.h"
#include "data/indexed_dataset.h"
#include "data/sampler.h"
#include "test_util.h"

namespace ac::data {
namespace {

using test::input_error;

// Token value = document * 100000 + position, so every token says where it came from.
class VectorSource : public TokenSource {
 public:
  explicit VectorSource(const std::vector<int64_t>& lengths, int64_t tag = 0) {
    for (size_t d = 0; d < lengths.size(); ++d) {
      std::vector<int64_t> v(lengths[d]);
      for (int64_t p = 0; p < lengths[d]; ++p) v[p] = tag * 100000000 + static_cast<int64_t>(d) * 100000 + p;
      docs_.push_back(v);
    }
  }
  int64_t num_documents() const override { return docs_.size(); }
  int64_t document_length(int64_t d) const override { return docs_[d].size(); }
  int64_t num_tokens() const override {
    int64_t n = 0;
    for (auto& d : docs_) n += d.size();
    return n;
  }
  void read(int64_t d, int64_t off, int64_t count, int64_t* out) const override {
    ASSERT_LE(off + count, static_cast<int64_t>(docs_[d].size()));
    std::copy(docs_[d].begin() + off, docs_[d].begin() + off + count, out);
  }
  void read(int64_t d, int64_t off, int64_t count, int32_t* out) const override {
    ASSERT_LE(off + count, static_cast<int64_t>(docs_[d].size()));
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(docs_[d][off + i]);
  }
  std::string describe() const override { return "vector"; }

 private:
  std::vector<std::vector<int64_t>> docs_;
};

std::shared_ptr<VectorSource> source(int n_docs, uint64_t seed, int64_t tag = 0) {
  Rng r(seed);
  std::vector<int64_t> len(n_docs);
  for (auto& l : len) l = 1 + static_cast<int64_t>(r.below(60));
  return std::make_shared<VectorSource>(len, tag);
}

const SplitSpec kAllTrain{1, 0, 0};

TEST(GptSampler, EpochIsAPermutationOfWindowsAcrossDocuments) {
  auto src = source(200, 1);
  const int64_t L = 16;
  GptSampler s(src, L, 42, kAllTrain, Split::Train);
  EXPECT_EQ(s.samples_per_epoch(), (src->num_tokens() - 1) / L);
  std::map<int64_t, int> seen;  // token -> times covered (excluding each sample's extra last token)
  std::vector<int64_t> buf(L + 1);
  int boundaries = 0;
  for (int64_t k = 0; k < s.samples_per_epoch(); ++k) {
    s.sample(k, buf.data());
    for (int64_t i = 0; i < L; ++i) {
      ++seen[buf[i]];
      const int64_t d = buf[i] / 100000, p = buf[i] % 100000, d2 = buf[i + 1] / 100000, p2 = buf[i + 1] % 100000;
      if (d2 == d) {
        EXPECT_EQ(p2, p + 1);
      } else {  // crossed into the next document of this epoch's order
        EXPECT_EQ(p + 1, src->document_length(d));
        EXPECT_EQ(p2, 0);
        ++boundaries;
      }
    }
  }
  EXPECT_GT(boundaries, 100);
  // Every token of the epoch but the tail (< L tokens) is covered exactly once.
  EXPECT_EQ(static_cast<int64_t>(seen.size()), s.samples_per_epoch() * L);
  EXPECT_GE(static_cast<int64_t>(seen.size()), src->num_tokens() - L);
  for (auto& [tok, n] : seen) ASSERT_EQ(n, 1) << tok;
}

TEST(GptSampler, DeterministicBySeedAndNewOrderEachEpoch) {
  auto src = source(100, 2);
  GptSampler a(src, 8, 7, kAllTrain, Split::Train), b(src, 8, 7, kAllTrain, Split::Train), c(src, 8, 8, kAllTrain, Split::Train);
  std::vector<int64_t> x(9), y(9), z(9);
  int differ = 0;
  for (int64_t k = 0; k < 3 * a.samples_per_epoch(); k += 3) {
    a.sample(k, x.data());
    b.sample(k, y.data());
    c.sample(k, z.data());
    EXPECT_EQ(x, y);
    differ += x != z;
  }
  EXPECT_GT(differ, 10);
  // Epoch 1 is a reshuffle of the same data: same token multiset, different order.
  const int64_t n = a.samples_per_epoch();
  std::vector<std::vector<int64_t>> e0, e1;
  for (int64_t k = 0; k < n; ++k) {
    a.sample(k, x.data());
    e0.push_back(x);
    a.sample(n + k, x.data());
    e1.push_back(x);
  }
  EXPECT_NE(e0, e1);
}

TEST(GptSampler, SplitsPartitionDocuments) {
  auto src = source(1000, 3);
  SplitSpec sp = parse_split("90,5,5");
  GptSampler tr(src, 8, 1, sp, Split::Train), ca(src, 8, 1, sp, Split::Calibration), ev(src, 8, 1, sp, Split::Eval);
  std::set<int64_t> all;
  for (auto* s : {&tr, &ca, &ev}) all.insert(s->documents().begin(), s->documents().end());
  EXPECT_EQ(all.size(), 1000u);
  EXPECT_EQ(tr.documents().size() + ca.documents().size() + ev.documents().size(), 1000u);
  EXPECT_EQ(tr.documents().size(), 900u);
  EXPECT_EQ(ca.documents().size(), 50u);
  // Samples of the eval split only hold eval documents.
  std::set<int64_t> evd(ev.documents().begin(), ev.documents().end());
  std::vector<int64_t> buf(9);
  for (int64_t k = 0; k < ev.samples_per_epoch(); ++k) {
    ev.sample(k, buf.data());
    for (int64_t t : buf) ASSERT_TRUE(evd.count(t / 100000));
  }
  EXPECT_NE(input_error([] { parse_split("1,2"); }).find("--split"), std::string::npos);
}

TEST(GptSampler, TooFewTokens) {
  auto src = std::make_shared<VectorSource>(std::vector<int64_t>{3, 4});
  EXPECT_NE(input_error([&] { GptSampler s(src, 16, 1, kAllTrain, Split::Train); }).find("fewer than one sample"), std::string::npos);
}

std::shared_ptr<BlendedSampler> blend(int n_sources, std::vector<double> w, int64_t L = 8) {
  std::vector<BlendEntry> e;
  for (int i = 0; i < n_sources; ++i) e.push_back({source(150 + 10 * i, 10 + i, i), w[i]});
  return std::make_shared<BlendedSampler>(e, L, 1234, kAllTrain, Split::Train);
}

TEST(DataLoader, RanksAreDisjointAndCoverTheGlobalOrder) {
  auto s = blend(1, {1.0});
  const int dp = 4, mbs = 3, steps = 10;
  std::set<int64_t> seen;
  for (int r = 0; r < dp; ++r) {
    DataLoader l(s, LoaderConfig{mbs, r, dp}, DataCursor::start(*s));
    for (int t = 0; t < steps; ++t) {
      for (int64_t i : l.next_indices()) EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " given twice";
      auto batch = l.next();
      // Row m is global sample consumed + r * mbs + m.
      std::vector<int64_t> want(s->seq_len() + 1);
      s->sample(static_cast<int64_t>(t) * dp * mbs + r * mbs + 1, want.data());
      EXPECT_TRUE(std::equal(want.begin(), want.end(), batch.begin() + (s->seq_len() + 1)));
    }
    EXPECT_EQ(l.cursor().consumed_samples, steps * dp * mbs);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(dp * mbs * steps));
  EXPECT_EQ(*seen.rbegin(), dp * mbs * steps - 1);
}

// The global stream of samples a set of DP loaders consumes, step by step, in index order.
std::vector<std::vector<int64_t>> run(std::shared_ptr<BlendedSampler> s, int dp, int mbs, int steps, DataCursor* cur) {
  std::vector<std::unique_ptr<DataLoader>> ls;
  for (int r = 0; r < dp; ++r) ls.push_back(std::make_unique<DataLoader>(s, LoaderConfig{mbs, r, dp}, *cur));
  std::vector<std::vector<int64_t>> out;
  for (int t = 0; t < steps; ++t) {
    for (auto& l : ls) {
      auto b = l->next();
      const size_t row = s->seq_len() + 1;
      for (int m = 0; m < mbs; ++m) out.emplace_back(b.begin() + m * row, b.begin() + (m + 1) * row);
    }
  }
  *cur = ls[0]->cursor();
  for (auto& l : ls) EXPECT_EQ(l->cursor().to_json(), cur->to_json());  // every rank holds the same cursor
  return out;
}

TEST(DataLoader, ExactResumeFromJsonCursor) {
  auto s = blend(2, {0.7, 0.3});
  DataCursor c = DataCursor::start(*s);
  auto first = run(s, 2, 2, 5, &c);
  const std::string saved = c.to_json().dump();
  auto rest = run(s, 2, 2, 5, &c);
  // A fresh process: new sampler objects, cursor from its JSON text.
  auto s2 = blend(2, {0.7, 0.3});
  DataCursor back = DataCursor::from_json(nlohmann::json::parse(saved));
  EXPECT_EQ(back.consumed_samples, 20);
  auto resumed = run(s2, 2, 2, 5, &back);
  EXPECT_EQ(resumed, rest);
  EXPECT_NE(first, rest);
}

TEST(DataLoader, ResumeUnderDifferentDpNeitherRepeatsNorSkips) {
  auto s = blend(3, {0.5, 0.3, 0.2});
  DataCursor ref_c = DataCursor::start(*s);
  auto reference = run(s, 1, 1, 2 * 2 * 3 + 3 * 2 * 4, &ref_c);  // one rank, one sample per step
  DataCursor c = DataCursor::start(*s);
  auto a = run(s, 2, 2, 3, &c);  // DP 2: 12 samples
  DataCursor back = DataCursor::from_json(nlohmann::json::parse(c.to_json().dump()));
  auto b = run(s, 4, 2, 3, &back);  // DP 4 from the saved cursor: 24 samples
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_EQ(a, reference);
  EXPECT_EQ(back.consumed_samples, 36);
}

TEST(BlendedSampler, GreedyProportionsWithinOnePercent) {
  auto s = blend(3, {5, 3, 2});  // normalized to 0.5, 0.3, 0.2
  EXPECT_DOUBLE_EQ(s->weights()[0], 0.5);
  const int n = 10000;
  std::vector<int> count(3, 0);
  std::vector<std::set<int64_t>> per(3);
  for (int i = 0; i < n; ++i) {
    auto [d, k] = s->locate(i);
    ++count[d];
    EXPECT_TRUE(per[d].insert(k).second);  // each dataset's samples used in order, once
  }
  for (int d = 0; d < 3; ++d) {
    EXPECT_NEAR(count[d] / double(n), s->weights()[d], 0.01) << d;
    EXPECT_EQ(static_cast<int>(*per[d].rbegin()), count[d] - 1);
  }
  // Megatron's rule by hand for the first samples: errors w*max(i,1) - used.
  std::vector<int> want = {0, 1, 2, 0, 1, 0, 2, 0, 1, 0};
  auto fresh = blend(3, {5, 3, 2});
  for (int i = 0; i < 10; ++i) EXPECT_EQ(fresh->locate(i).first, want[i]) << i;
  // Random access (going backwards restarts the walk) gives the same answers.
  EXPECT_EQ(fresh->locate(3), s->locate(3));
  EXPECT_EQ(fresh->locate(9999), s->locate(9999));
  // Tokens of a blended sample come from the dataset locate() names (tag in the value).
  std::vector<int64_t> buf(9);
  for (int i = 0; i < 50; ++i) {
    s->sample(i, buf.data());
    EXPECT_EQ(buf[0] / 100000000, s->locate(i).first);
  }
}

TEST(DataCursor, RejectsCursorOfAnotherRun) {
  auto s = blend(2, {0.5, 0.5});
  DataCursor c = DataCursor::start(*s);
  auto j = c.to_json();
  auto err = [&](nlohmann::json v) {
    return input_error([&] {
      const std::string where = "ckpt/step_10.h5: data_cursor";
      DataCursor::from_json(v, where).check_matches(*s, where);
    });
  };
  {
    auto v = j;
    v["seed"] = 99;
    EXPECT_NE(err(v).find("ckpt/step_10.h5: data_cursor: seed"), std::string::npos);
  }
  {
    auto v = j;
    v["seq_len"] = 4;
    EXPECT_NE(err(v).find("seq_len"), std::string::npos);
  }
  {
    auto v = j;
    v["dataset_tokens"][0] = 1;
    EXPECT_NE(err(v).find("dataset_tokens"), std::string::npos);
  }
  {
    auto v = j;
    v["weights"] = {0.9, 0.1};
    EXPECT_NE(err(v).find("weights"), std::string::npos);
  }
  {
    auto v = j;
    v.erase("consumed_samples");
    EXPECT_NE(err(v).find("consumed_samples: missing"), std::string::npos);
  }
  {
    auto v = j;
    v["consumed_samples"] = "ten";
    EXPECT_NE(err(v).find("wrong type"), std::string::npos);
  }
  EXPECT_NE(input_error([&] { DataLoader l(s, LoaderConfig{1, 2, 2}, c); }).find("dp_rank"), std::string::npos);
  auto other = j;
  other["seed"] = 5;
  EXPECT_NE(input_error([&] { DataLoader l(s, LoaderConfig{}, DataCursor::from_json(other)); }).find("data cursor: seed"), std::string::npos);
}

TEST(GptSampler, ReadsMegatronFilesThroughTokenSource) {
  test::TempDir dir;
  {
    IndexedDatasetWriter w(dir / "ds", DType::U16);
    for (int d = 0; d < 50; ++d) {
      std::vector<int64_t> v(1 + d % 7, d);
      w.add_document(v.data(), v.size());
    }
    w.finalize();
  }
  auto src = open_token_source(dir / "ds");
  GptSampler s(src, 4, 3, kAllTrain, Split::Train);
  std::vector<int64_t> buf(5);
  int64_t total = 0;
  for (int64_t k = 0; k < s.samples_per_epoch(); ++k) {
    s.sample(k, buf.data());
    for (int64_t t : buf) total += t >= 0 && t < 50;
  }
  EXPECT_EQ(total, s.samples_per_epoch() * 5);
}

// The int32 batches the trainer reads are the int64 ones, token for token, from every
// Megatron dtype and every HDF5 store type, through a blend, on two DP ranks.
TEST(DataLoader, Int32BatchesEqualInt64Batches) {
  test::TempDir dir;
  Rng r(11);
  std::vector<std::vector<int64_t>> docs(40);
  for (auto& d : docs) {
    d.resize(1 + r.below(30));
    for (auto& t : d) t = static_cast<int64_t>(r.below(120));  // fits every dtype, uint8 included
  }
  std::vector<std::pair<std::string, std::shared_ptr<TokenSource>>> sources;
  for (DType t : {DType::U8, DType::I8, DType::I16, DType::U16, DType::I32, DType::I64, DType::F32, DType::F64}) {
    const std::string prefix = dir / (std::string("ds_") + dtype_name(t));
    IndexedDatasetWriter w(prefix, t);
    for (auto& d : docs) w.add_document(d.data(), d.size());
    w.finalize();
    sources.emplace_back(dtype_name(t), open_token_source(prefix));
  }
  for (DType t : {DType::U16, DType::I32, DType::I64}) {
    const std::string path = dir / (std::string("store_") + dtype_name(t) + ".h5");
    Hdf5StoreOptions o;
    o.dtype = t;
    o.chunk_tokens = 64;
    Hdf5TokenWriter w(path, o);
    for (auto& d : docs) w.add_document(d.data(), d.size());
    w.finalize();
    sources.emplace_back(std::string("h5 ") + dtype_name(t), open_token_source(path));
  }
  for (auto& [name, src] : sources) {
    SCOPED_TRACE(name);
    auto other = source(30, 5, 1);
    auto s = std::make_shared<BlendedSampler>(std::vector<BlendEntry>{{src, 0.7}, {other, 0.3}}, 9, 17, kAllTrain, Split::Train);
    for (int rank = 0; rank < 2; ++rank) {
      DataLoader a(s, LoaderConfig{3, rank, 2}, DataCursor::start(*s)), b(s, LoaderConfig{3, rank, 2}, DataCursor::start(*s));
      std::vector<int32_t> narrow(3 * 10);
      for (int step = 0; step < 25; ++step) {
        std::vector<int64_t> wide = a.next();
        b.next(narrow.data());
        ASSERT_EQ(std::vector<int64_t>(narrow.begin(), narrow.end()), wide) << "step " << step;
      }
      EXPECT_EQ(a.cursor().consumed_samples, b.cursor().consumed_samples);
    }
  }
}

// An int64 id that int32 cannot hold is an error naming the file, never a silent wrap.
TEST(DataLoader, Int32RefusesIdsThatDoNotFit) {
  test::TempDir dir;
  std::vector<int64_t> doc{1, 2, int64_t{1} << 33, 4, 5, 6, 7, 8};
  {
    IndexedDatasetWriter w(dir / "big", DType::I64);
    w.add_document(doc.data(), doc.size());
    w.finalize();
    Hdf5StoreOptions o;
    o.dtype = DType::I64;
    Hdf5TokenWriter h(dir / "big.h5", o);
    h.add_document(doc.data(), doc.size());
    h.finalize();
  }
  std::vector<int32_t> out(doc.size());
  std::vector<int64_t> wide(doc.size());
  for (std::string path : {std::string(dir / "big"), std::string(dir / "big.h5")}) {
    SCOPED_TRACE(path);
    auto src = open_token_source(path);
    src->read(0, 0, doc.size(), wide.data());
    EXPECT_EQ(wide, doc);
    src->read(0, 3, 5, out.data());  // the ids after the big one are fine
    EXPECT_EQ(out[0], 4);
    const std::string msg = input_error([&] { src->read(0, 0, doc.size(), out.data()); });
    EXPECT_NE(msg.find("big"), std::string::npos) << msg;
    EXPECT_NE(msg.find("does not fit int32"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace ac::data
