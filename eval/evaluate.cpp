// evaluate_lm: the trainer's eval pass as a stand-alone measurement of a checkpoint.
#include "eval/evaluate.h"

#include <torch/torch.h>

#include <chrono>
#include <algorithm>
#include <cmath>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "data/bpe_tokenizer.h"
#include "data/sampler.h"
#include "dist/communicator.h"
#include "dist/cpu_features.h"
#include "dist/error.h"
#include "dist/device.h"
#include "dist/parallel_layout.h"
#include "dist/tensor_parallel.h"
#include "distill/kd_loss.h"
#include "model/model.h"

namespace ac::eval {

namespace {

bool ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// One last-word example: the context ids and the ids of " word" that follow them.
struct LastWordExample {
  std::vector<int64_t> context, target;
};

// The last-word example of a document's ids, or nullopt when the document does not end in a
// usable word (EvalConfig::last_word_docs).
std::optional<LastWordExample> last_word_example(const data::BpeTokenizer& tok, const std::vector<int64_t>& doc,
                                                 int64_t max_tokens) {
  std::vector<int64_t> plain;  // added tokens (end of document, chat markup) are not text
  for (int64_t id : doc)
    if (id >= 0 && id < tok.vocab_size() && !tok.is_added_token(id)) plain.push_back(id);
  if (int64_t(plain.size()) > max_tokens) plain.erase(plain.begin(), plain.end() - max_tokens);
  std::string text;
  try {
    text = tok.decode(plain);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  size_t end = text.size();
  auto trailing = [&](char c) { return std::string(" \t\r\n.,;:!?\"')]}*_-~`").find(c) != std::string::npos; };
  while (end > 0 && trailing(text[end - 1])) --end;
  size_t start = end;
  while (start > 0 && ascii_letter(text[start - 1])) --start;
  if (end - start < 2 || start == 0 || text[start - 1] != ' ') return std::nullopt;
  const std::string context = text.substr(0, start - 1), target = text.substr(start - 1, end - start + 1);
  LastWordExample ex;
  ex.context = tok.encode(context);
  std::vector<int64_t> full = tok.encode(context + target);
  if (ex.context.size() < 8 || full.size() <= ex.context.size() || int64_t(full.size()) > max_tokens ||
      !std::equal(ex.context.begin(), ex.context.end(), full.begin()))
    return std::nullopt;  // the word's tokens would merge with the context's: no clean boundary
  ex.target.assign(full.begin() + long(ex.context.size()), full.end());
  return ex;
}

// TP 1: each row's cross-entropy and argmax from its logits [N, V] without a softmax tensor.
// max(1) gives the row maxima and the argmax in one pass; then exp(l - max) is summed over
// blocks of rows small enough to stay in cache (one reused buffer, the logits unchanged). The
// loss is computed as vocab_parallel_cross_entropy computes it: log(sum exp(l - max)) -
// (l[t] - max). It saves the eval pass the fp32 copy of the logits, the softmax division
// kept for backward, and a separate argmax pass (docs/benchmarks.md, tenth session).
std::pair<torch::Tensor, torch::Tensor> cross_entropy_and_argmax(const torch::Tensor& logits, const torch::Tensor& labels) {
  const torch::Tensor l = logits.to(torch::kFloat32).contiguous();
  const int64_t N = l.size(0), V = l.size(1);
  auto [row_max, argmax] = l.max(1);
  torch::Tensor sum_exp = torch::empty({N}, l.options());
  const int64_t block = std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(1, V));  // ~1 MB of fp32
  torch::Tensor buf = torch::empty({std::min(block, N), V}, l.options());
  for (int64_t r = 0; r < N; r += block) {
    const int64_t n = std::min(block, N - r);
    torch::Tensor b = buf.narrow(0, 0, n);
    at::sub_out(b, l.narrow(0, r, n), row_max.narrow(0, r, n).unsqueeze(1));
    b.exp_();
    torch::Tensor out = sum_exp.narrow(0, r, n);
    at::sum_out(out, b, {1});
  }
  torch::Tensor picked = l.gather(1, labels.to(torch::kLong).unsqueeze(1)).squeeze(1) - row_max;
  return {sum_exp.log() - picked, argmax};
}

void check_eval_options(const EvalConfig& cfg) {
  if (cfg.data.empty()) throw InputError("command line", "--data", "at least one dataset is needed");
  if (cfg.seq_len <= 0) throw InputError("command line", "--seq-len", "must be positive");
  if (cfg.micro_batch <= 0) throw InputError("command line", "--micro-batch", "must be positive");
  if (cfg.samples < 0) throw InputError("command line", "--samples", "must be >= 0");
}

// The teacher for the KL column, on the model's TP group, dtype and device.
std::optional<model::CausalLM> load_kl_teacher(const EvalConfig& cfg, const model::ArchSpec& spec, const std::string& path,
                                               const dist::ParallelLayout& layout, const model::TpGroup& tp,
                                               torch::Dtype dtype, const torch::Device& device) {
  std::optional<model::CausalLM> teacher;
  if (cfg.teacher.empty()) return teacher;
  const std::string tpath = checkpoint::resolve_checkpoint(cfg.teacher);
  checkpoint::CheckpointReader treader(tpath);
  const model::ArchSpec tspec = checkpoint::checkpoint_arch(treader);
  if (tspec.vocab_size != spec.vocab_size)
    throw InputError(tpath, "vocab_size", std::to_string(tspec.vocab_size) + ", the model " + path + " has " +
                                              std::to_string(spec.vocab_size) + ": KL needs one vocabulary");
  if (const std::string why = model::tp_split_problem(tspec, layout.tp_size()); !why.empty())
    throw InputError(tpath, "arch_spec (--tp " + std::to_string(layout.tp_size()) + ")", why);
  teacher.emplace(tspec, tp, model::ModelOptions{dtype});
  checkpoint::load_model(*teacher, treader);
  (*teacher)->to(device);
  (*teacher)->eval();
  return teacher;
}

// [vocab] UTF-8 bytes each id decodes to (0: added tokens, padding ids), for bits per byte.
torch::Tensor token_byte_lengths(const data::BpeTokenizer& tok, int64_t vocab, const torch::Device& device) {
  torch::Tensor token_bytes = torch::zeros({vocab}, torch::kDouble);
  auto* b = token_bytes.data_ptr<double>();
  for (int64_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_added_token(id)) continue;
    try {
      b[id] = double(tok.decode({id}).size());
    } catch (const std::out_of_range&) {  // an id the tokenizer does not use
    }
  }
  return token_bytes.to(device);
}

// What one rank's pass adds up, before the sum over DP.
struct LmSums {
  double loss = 0, correct = 0, count = 0, bytes = 0, kl = 0;
};

// One micro-batch: cross-entropy, hits, bytes and KL of its rows weighted by `weight` [B, 1]
// (rows past the samples asked weigh 0), added to `sums`.
void score_lm_batch(const EvalConfig& cfg, model::CausalLM& m, std::optional<model::CausalLM>& teacher,
                    const model::TpGroup& tp, int64_t vocab, const torch::Tensor& ids, const torch::Tensor& weight,
                    const torch::Tensor& token_bytes, LmSums& sums) {
  torch::Tensor input = ids.narrow(1, 0, cfg.seq_len).contiguous();
  torch::Tensor labels = ids.narrow(1, 1, cfg.seq_len).contiguous();
  torch::Tensor local = m->logits_local(m->hidden_states(input));
  torch::Tensor ce, hit;
  if (tp.size() == 1) {
    auto [loss, argmax] = cross_entropy_and_argmax(m->gather_logits(local).reshape({-1, vocab}), labels.reshape({-1}));
    ce = loss.to(torch::kDouble).view({cfg.micro_batch, cfg.seq_len});
    hit = (argmax.view_as(labels) == labels).to(torch::kDouble);
  } else {
    ce = dist::vocab_parallel_cross_entropy(local.reshape({-1, local.size(2)}), labels.reshape({-1}), *tp.comm, vocab)
             .to(torch::kDouble)
             .view({cfg.micro_batch, cfg.seq_len});
    hit = (m->gather_logits(local).argmax(-1) == labels).to(torch::kDouble);
  }
  sums.loss += (ce * weight).sum().item<double>();
  if (token_bytes.defined())
    sums.bytes += (token_bytes.index_select(0, labels.reshape({-1})).view_as(ce) * weight).sum().item<double>();
  if (teacher) {
    torch::Tensor t_local = (*teacher)->logits_local((*teacher)->hidden_states(input));
    torch::Tensor mask = weight.expand({cfg.micro_batch, cfg.seq_len}).reshape({-1}).to(torch::kFloat32);
    const double kept = mask.sum().item<double>();
    if (kept > 0)
      sums.kl += distill::vocab_parallel_kl(local.reshape({-1, local.size(2)}), t_local.reshape({-1, t_local.size(2)}),
                                            *tp.comm, vocab, distill::KdOptions{}, mask)
                     .item<double>() *
                 kept;
  }
  sums.correct += (hit * weight).sum().item<double>();
  sums.count += weight.sum().item<double>() * double(cfg.seq_len);
}

struct LastWordSums {
  double hits = 0, scored = 0;
  int64_t examined = 0;
};

// Last-word task: documents of the split in ascending order, dealt round-robin over DP.
LastWordSums score_last_words(const EvalConfig& cfg, const std::vector<data::BlendEntry>& entries,
                              const data::BpeTokenizer& tok, const model::ArchSpec& spec, model::CausalLM& m,
                              const dist::ParallelLayout& layout, const torch::Device& device) {
  LastWordSums lw;
  const int64_t max_tokens =
      spec.max_position_embeddings > 0 ? std::min(cfg.seq_len, spec.max_position_embeddings) : cfg.seq_len;
  std::vector<LastWordExample> examples;
  for (const auto& e : entries) {
    const data::GptSampler split_docs(e.source, cfg.seq_len, cfg.seed, data::parse_split(cfg.split),
                                      data::split_from_name(cfg.which));
    for (int64_t d : split_docs.documents()) {
      if (int64_t(examples.size()) >= cfg.last_word_docs) break;
      ++lw.examined;
      std::vector<int64_t> ids(size_t(e.source->document_length(d)));
      e.source->read(d, 0, int64_t(ids.size()), ids.data());
      if (auto ex = last_word_example(tok, ids, max_tokens)) examples.push_back(std::move(*ex));
    }
  }
  for (size_t i = size_t(layout.dp_rank()); i < examples.size(); i += size_t(layout.dp_size())) {
    const auto& ex = examples[i];
    std::vector<int64_t> full = ex.context;
    full.insert(full.end(), ex.target.begin(), ex.target.end() - 1);  // the last target token is not an input
    torch::Tensor in = torch::tensor(full, torch::kInt64).view({1, -1}).to(device);
    const int64_t first = int64_t(ex.context.size()) - 1, n = int64_t(ex.target.size());
    torch::Tensor h = m->hidden_states(in).narrow(1, first, n);
    torch::Tensor pred = m->gather_logits(m->logits_local(h)).argmax(-1).view({-1});
    lw.hits += pred.to(torch::kCPU).equal(torch::tensor(ex.target, torch::kInt64)) ? 1.0 : 0.0;
    lw.scored += 1.0;
  }
  return lw;
}

}  // namespace


EvalResult evaluate_lm(const EvalConfig& cfg, MPI_Comm world, const std::function<void(int64_t, int64_t)>& progress) {
  check_eval_options(cfg);
  const auto t0 = std::chrono::steady_clock::now();

  // ---- model ------------------------------------------------------------------------------
  const dist::DeviceChoice dev = dist::choose_device(cfg.device, cfg.local_rank);
  const torch::Device device = dev.torch_device();
  dist::apply_tf32_policy(dev);
  const std::string path = checkpoint::resolve_checkpoint(cfg.model);
  checkpoint::CheckpointReader reader(path);
  const model::ArchSpec spec = checkpoint::checkpoint_arch(reader);
  dist::ParallelLayout layout(world, {cfg.tp, 0, 0});
  if (const std::string why = model::tp_split_problem(spec, layout.tp_size()); !why.empty())
    throw InputError(path, "arch_spec (--tp " + std::to_string(layout.tp_size()) + ")", why);
  const dist::DtypeChoice dt = dist::choose_dtype(cfg.dtype, dev.cuda);
  // TP collectives take the model's (device) tensors; DP sums are host doubles over MPI.
  model::TpGroup tp{dist::make_device_communicator(layout.tp_mpi_comm(), dev)};
  model::CausalLM m(spec, tp, model::ModelOptions{checkpoint::parse_dtype(dt.dtype)});
  checkpoint::load_model(m, reader);
  m->to(device);
  m->eval();
  std::optional<model::CausalLM> teacher =
      load_kl_teacher(cfg, spec, path, layout, tp, checkpoint::parse_dtype(dt.dtype), device);
  std::shared_ptr<const data::BpeTokenizer> tok;
  torch::Tensor token_bytes;
  if (!cfg.tokenizer.empty()) {
    tok = data::BpeTokenizer::from_file(cfg.tokenizer);
    if (tok->vocab_size() > spec.vocab_size)
      throw InputError(cfg.tokenizer, "model.vocab", "has " + std::to_string(tok->vocab_size()) + " ids, the model " +
                                                         path + " only " + std::to_string(spec.vocab_size));
    token_bytes = token_byte_lengths(*tok, spec.vocab_size, device);
  }

  // ---- data: the trainer's split and sample order -------------------------------------------
  std::vector<data::BlendEntry> entries;
  for (const auto& d : cfg.data) entries.push_back(data::parse_blend_entry(d));
  auto sampler = std::make_shared<data::BlendedSampler>(entries, cfg.seq_len, cfg.seed, data::parse_split(cfg.split),
                                                        data::split_from_name(cfg.which));
  int64_t split_samples = 0;
  for (size_t d = 0; d < sampler->num_datasets(); ++d) split_samples += sampler->dataset(d).samples_per_epoch();
  if (split_samples == 0)
    throw InputError(cfg.data[0], "--seq-len " + std::to_string(cfg.seq_len),
                     "the " + cfg.which + " split has fewer than seq_len + 1 tokens: no sample to score");
  const int64_t total = cfg.samples > 0 ? cfg.samples : split_samples;
  const int dp = layout.dp_size();
  data::DataLoader loader(sampler, {cfg.micro_batch, layout.dp_rank(), dp}, data::DataCursor::start(*sampler));

  // ---- the pass: every rank scores its rows, samples past `total` weigh 0 ------------------
  const int64_t vocab = spec.vocab_size;
  const int64_t per_step = cfg.micro_batch * dp;
  const int64_t steps = (total + per_step - 1) / per_step;
  LmSums lm;
  torch::NoGradGuard ng;
  for (int64_t s = 0; s < steps; ++s) {
    const std::vector<int64_t> idx = loader.next_indices();
    torch::Tensor ids = torch::empty({cfg.micro_batch, cfg.seq_len + 1}, torch::kLong);
    loader.next(ids.data_ptr<int64_t>());
    if (const int64_t hi = ids.max().item<int64_t>(); hi >= vocab || ids.min().item<int64_t>() < 0)
      throw InputError(cfg.data[0], "token ids", "id " + std::to_string(hi) + " is outside the model's vocabulary of " +
                                                      std::to_string(vocab) + " (" + path + "): another tokenizer?");
    torch::Tensor weight = torch::zeros({cfg.micro_batch, 1}, torch::kDouble);
    for (int64_t r = 0; r < cfg.micro_batch; ++r) weight[r] = idx[static_cast<size_t>(r)] < total ? 1.0 : 0.0;
    score_lm_batch(cfg, m, teacher, tp, vocab, ids.to(device), weight.to(device), token_bytes, lm);
    if (progress && layout.world_rank() == 0) progress(std::min(total, (s + 1) * per_step), total);
  }
  LastWordSums lw;
  if (tok && cfg.last_word_docs > 0) lw = score_last_words(cfg, entries, *tok, spec, m, layout, device);

  torch::Tensor sums = torch::tensor({lm.loss, lm.correct, lm.count, lm.bytes, lm.kl, lw.hits, lw.scored}, torch::kDouble);
  if (dp > 1) layout.dp().all_reduce(sums, dist::ReduceOp::Sum);

  EvalResult r;
  r.loss = sums[0].item<double>() / sums[2].item<double>();
  r.perplexity = std::exp(r.loss);
  r.accuracy = sums[1].item<double>() / sums[2].item<double>();
  r.samples = total;
  r.tokens = int64_t(sums[2].item<double>());
  r.split_samples = split_samples;
  r.parameters = m->logical_parameter_count();
  r.dtype = dt.dtype;
  r.dtype_reason = dt.reason;
  r.device = dev.device;
  r.device_reason = dev.reason;
  r.tp = layout.tp_size();
  r.dp = dp;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.tokens_per_second = double(r.tokens) / r.seconds;
  if (tok) {
    r.bytes = int64_t(sums[3].item<double>());
    if (r.bytes > 0) r.bits_per_byte = sums[0].item<double>() / std::log(2.0) / sums[3].item<double>();
  }
  if (teacher) r.kl_to_teacher = sums[4].item<double>() / sums[2].item<double>();
  r.last_word_scored = int64_t(sums[6].item<double>());
  r.last_word_examined = lw.examined;
  if (r.last_word_scored > 0) r.last_word_accuracy = sums[5].item<double>() / sums[6].item<double>();
  return r;
}

}  // namespace ac::eval
