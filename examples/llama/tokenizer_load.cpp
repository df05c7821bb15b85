// Building a tokenizer_spec from GGUF metadata or from a Hugging Face tokenizer.json.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gguf.hpp"
#include "load_error.hpp"
#include "tokenizer.hpp"

namespace pagedkv::llama {
namespace {

std::pair<std::string, std::string> split_merge(const std::string& merge, std::string_view source, std::size_t index) {
  // "left right": the separator is the first space after the first character, so that a left part
  // that is itself a space still parses.
  const auto space = merge.size() > 1 ? merge.find(' ', 1) : std::string::npos;
  if (space == std::string::npos)
    fail_in(source, "merges[" + std::to_string(index) + "]", "'", merge, "' is not two tokens separated by a space");
  return {merge.substr(0, space), merge.substr(space + 1)};
}

token_id optional_id(const gguf_file& file, std::string_view key) {
  const auto value = file.try_get_uint(key);
  if (!value) return -1;
  if (*value > static_cast<std::uint64_t>(std::numeric_limits<token_id>::max()))
    fail_in(file.file_name(), "metadata '" + std::string(key) + "'", "token id ", *value, " is too large");
  return static_cast<token_id>(*value);
}

}  // namespace

tokenizer tokenizer::from_gguf(const gguf_file& file) {
  tokenizer_spec spec;
  const auto& model = file.get_string("tokenizer.ggml.model");
  if (model == "gpt2") spec.model = tokenizer_model::byte_level_bpe;
  else if (model == "llama") spec.model = tokenizer_model::sentencepiece_bpe;
  else fail_in(file.file_name(), "metadata 'tokenizer.ggml.model'", "tokenizer model '", model, "' is not supported (gpt2 and llama are)");

  spec.tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (file.find("tokenizer.ggml.token_type")) {
    for (const auto type : file.get_int_array("tokenizer.ggml.token_type")) {
      if (type < 1 || type > 6) fail_in(file.file_name(), "metadata 'tokenizer.ggml.token_type'", "token type ", type, " is not 1 to 6");
      spec.kinds.push_back(static_cast<token_kind>(type));
    }
  }
  if (file.find("tokenizer.ggml.scores")) spec.scores = file.get_float_array("tokenizer.ggml.scores");
  if (file.find("tokenizer.ggml.merges")) {
    const auto merges = file.get_string_array("tokenizer.ggml.merges");
    spec.merges.reserve(merges.size());
    for (std::size_t i = 0; i < merges.size(); ++i) spec.merges.push_back(split_merge(merges[i], file.file_name(), i));
  }
  if (spec.model == tokenizer_model::byte_level_bpe) {
    const auto pre = file.try_get_string("tokenizer.ggml.pre").value_or("gpt2");
    // llama.cpp's names for the pre-tokenizers that are the GPT-2 regex, with or without digits
    // isolated first (llama-vocab.cpp).
    if (pre == "gpt2") spec.pre = pre_tokenizer::gpt2;
    else if (pre == "smollm" || pre == "starcoder" || pre == "refact") spec.pre = pre_tokenizer::gpt2_digits;
    else fail_in(file.file_name(), "metadata 'tokenizer.ggml.pre'", "pre-tokenizer '", pre, "' is not supported (gpt2, smollm, starcoder, refact are)");
  }
  spec.bos_id = optional_id(file, "tokenizer.ggml.bos_token_id");
  spec.eos_id = optional_id(file, "tokenizer.ggml.eos_token_id");
  spec.unknown_id = optional_id(file, "tokenizer.ggml.unknown_token_id");
  spec.padding_id = optional_id(file, "tokenizer.ggml.padding_token_id");
  const bool spm = spec.model == tokenizer_model::sentencepiece_bpe;
  spec.add_bos = file.try_get_bool("tokenizer.ggml.add_bos_token").value_or(spm);
  spec.spm_prefix = file.try_get_bool("tokenizer.ggml.add_space_prefix").value_or(spm) ? space_prefix::always : space_prefix::none;
  spec.byte_fallback = spm;
  // GGUF's unknown_token_id comes from tokenizer_config.json, not from the BPE model: Hugging Face's
  // byte-level BPEs have no unk_token and drop characters missing from the vocabulary.
  spec.encode_unknown = spm;
  return tokenizer(std::move(spec), file.file_name());
}

namespace {

tokenizer_spec spec_from_json(std::string_view json_text, const std::string& source) {
  using nlohmann::json;
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    fail_at(source, "JSON", e.byte, e.what());
  } catch (const json::exception& e) {  // out_of_range: a number too large for a double
    fail_in(source, "JSON", e.what());
  }
  const auto member = [&](const json& object, const char* key, std::string_view path) -> const json* {
    if (!object.is_object()) fail_in(source, path, "expected an object, found ", object.type_name());
    const auto it = object.find(key);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  };
  const auto string_member = [&](const json& object, const char* key, std::string_view path) -> std::string {
    const auto* value = member(object, key, path);
    if (!value) return {};
    if (!value->is_string()) fail_in(source, std::string(path) + "." + key, "expected a string, found ", value->type_name());
    return value->get<std::string>();
  };
  const auto bool_member = [&](const json& object, const char* key, std::string_view path, bool fallback) {
    const auto* value = member(object, key, path);
    if (!value) return fallback;
    if (!value->is_boolean()) fail_in(source, std::string(path) + "." + key, "expected a boolean, found ", value->type_name());
    return value->get<bool>();
  };

  const auto* model = member(root, "model", "tokenizer");
  if (!model) fail_in(source, "model", "the key is missing");
  if (string_member(*model, "type", "model") != "BPE") fail_in(source, "model.type", "only BPE models are supported");
  const auto* vocab = member(*model, "vocab", "model");
  if (!vocab || !vocab->is_object()) fail_in(source, "model.vocab", "missing or not an object");
  const auto* added = member(root, "added_tokens", "tokenizer");
  if (added && !added->is_array()) fail_in(source, "added_tokens", "expected an array, found ", added->type_name());

  // Ids are dense in practice; capping them by the number of entries keeps a hostile id from
  // allocating gigabytes. Holes become unused empty tokens.
  const std::size_t entries = vocab->size() + (added ? added->size() : 0);
  tokenizer_spec spec;
  const auto place = [&](const std::string& text, const json& id, std::string_view path, token_kind kind) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || static_cast<std::size_t>(id.get<std::int64_t>()) >= entries)
      fail_in(source, path, "id ", id.dump(), " of '", text, "' is not an integer in [0, ", entries, ")");
    const auto index = static_cast<std::size_t>(id.get<std::int64_t>());
    if (index >= spec.tokens.size()) {
      spec.tokens.resize(index + 1);
      spec.kinds.resize(index + 1, token_kind::unused);
    }
    spec.tokens[index] = text;
    spec.kinds[index] = kind;
  };
  for (const auto& [text, id] : vocab->items()) place(text, id, "model.vocab", token_kind::normal);
  if (added) {
    for (std::size_t i = 0; i < added->size(); ++i) {
      const auto path = "added_tokens[" + std::to_string(i) + "]";
      const auto& token = (*added)[i];
      const auto* id = member(token, "id", path);
      if (!id) fail_in(source, path + ".id", "the key is missing");
      const bool special = bool_member(token, "special", path, false);
      place(string_member(token, "content", path), *id, path, special ? token_kind::control : token_kind::user_defined);
    }
  }

  if (const auto* merges = member(*model, "merges", "model")) {
    if (!merges->is_array()) fail_in(source, "model.merges", "expected an array, found ", merges->type_name());
    spec.merges.reserve(merges->size());
    for (std::size_t i = 0; i < merges->size(); ++i) {
      const auto& merge = (*merges)[i];
      if (merge.is_string()) {
        spec.merges.push_back(split_merge(merge.get<std::string>(), source, i));
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
        spec.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      } else {
        fail_in(source, "model.merges[" + std::to_string(i) + "]", "expected \"a b\" or [\"a\", \"b\"], found ", merge.dump());
      }
    }
  }
  spec.byte_fallback = bool_member(*model, "byte_fallback", "model", false);
  if (const auto unknown = string_member(*model, "unk_token", "model"); !unknown.empty()) {
    const auto it = std::find(spec.tokens.begin(), spec.tokens.end(), unknown);
    if (it == spec.tokens.end()) fail_in(source, "model.unk_token", "'", unknown, "' is not in the vocabulary");
    spec.unknown_id = static_cast<token_id>(it - spec.tokens.begin());
    spec.kinds[spec.unknown_id] = token_kind::unknown;
  }

  // Recognize the pipelines of the two supported families; anything else would give wrong ids.
  const json null_json;
  const auto* pre = member(root, "pre_tokenizer", "tokenizer");
  const auto* normalizer = member(root, "normalizer", "tokenizer");
  const auto type_of = [&](const json* node, std::string_view path) { return node ? string_member(*node, "type", path) : std::string(); };
  const auto is_byte_level = [&](const json& node, std::string_view path) {
    return type_of(&node, path) == "ByteLevel" && bool_member(node, "use_regex", path, true);
  };
  const auto pre_type = type_of(pre, "pre_tokenizer");
  const auto normalizer_type = type_of(normalizer, "normalizer");
  if (pre_type == "ByteLevel" && is_byte_level(*pre, "pre_tokenizer") && normalizer_type.empty()) {
    spec.model = tokenizer_model::byte_level_bpe;
    spec.pre = pre_tokenizer::gpt2;
    spec.add_prefix_space = bool_member(*pre, "add_prefix_space", "pre_tokenizer", false);
  } else if (pre_type == "Sequence" && normalizer_type.empty()) {
    const auto* steps = member(*pre, "pretokenizers", "pre_tokenizer");
    if (!steps || !steps->is_array() || steps->size() != 2 || type_of(&(*steps)[0], "pre_tokenizer.pretokenizers[0]") != "Digits" ||
        !bool_member((*steps)[0], "individual_digits", "pre_tokenizer.pretokenizers[0]", false) ||
        !is_byte_level((*steps)[1], "pre_tokenizer.pretokenizers[1]"))
      fail_in(source, "pre_tokenizer", "only Sequence[Digits(individual_digits), ByteLevel] is supported");
    spec.model = tokenizer_model::byte_level_bpe;
    spec.pre = pre_tokenizer::gpt2_digits;
    spec.add_prefix_space = bool_member((*steps)[1], "add_prefix_space", "pre_tokenizer.pretokenizers[1]", false);
  } else if (pre_type.empty() && normalizer_type == "Sequence") {
    // LLaMA-2: Prepend("▁") then Replace(" ", "▁").
    const auto* steps = member(*normalizer, "normalizers", "normalizer");
    if (!steps || !steps->is_array() || steps->size() != 2 || type_of(&(*steps)[0], "normalizer.normalizers[0]") != "Prepend" ||
        string_member((*steps)[0], "prepend", "normalizer.normalizers[0]") != "\xE2\x96\x81" ||
        type_of(&(*steps)[1], "normalizer.normalizers[1]") != "Replace")
      fail_in(source, "normalizer", "only Sequence[Prepend(\"\u2581\"), Replace(\" \", \"\u2581\")] is supported");
    spec.model = tokenizer_model::sentencepiece_bpe;
    spec.spm_prefix = space_prefix::always;
  } else if (pre_type == "Metaspace" && normalizer_type.empty()) {
    if (string_member(*pre, "replacement", "pre_tokenizer") != "\xE2\x96\x81" || bool_member(*pre, "split", "pre_tokenizer", true))
      fail_in(source, "pre_tokenizer", "only Metaspace with replacement \"\u2581\" and split false is supported");
    const auto scheme = string_member(*pre, "prepend_scheme", "pre_tokenizer");
    spec.model = tokenizer_model::sentencepiece_bpe;
    if (scheme == "always" || scheme.empty()) spec.spm_prefix = space_prefix::metaspace_always;
    else if (scheme == "first") spec.spm_prefix = space_prefix::metaspace_first;
    else if (scheme == "never") spec.spm_prefix = space_prefix::none;
    else fail_in(source, "pre_tokenizer.prepend_scheme", "'", scheme, "' is not always, first or never");
  } else {
    fail_in(source, "pre_tokenizer", "the pipeline (normalizer '", normalizer_type, "', pre-tokenizer '", pre_type,
            "') is neither byte-level BPE nor SentencePiece BPE");
  }

  // tokenizer.json does not say which tokens are BOS and EOS (tokenizer_config.json does); the
  // post-processor's template and the usual names stand in.
  const auto find_text = [&](std::initializer_list<std::string_view> names) -> token_id {
    for (const auto name : names)
      if (const auto it = std::find(spec.tokens.begin(), spec.tokens.end(), name); it != spec.tokens.end())
        return static_cast<token_id>(it - spec.tokens.begin());
    return -1;
  };
  if (const auto* post = member(root, "post_processor", "tokenizer"); post && type_of(post, "post_processor") == "TemplateProcessing") {
    const auto* single = member(*post, "single", "post_processor");
    if (single && single->is_array() && !single->empty() && (*single)[0].is_object() && (*single)[0].contains("SpecialToken")) {
      const auto& first = (*single)[0]["SpecialToken"];
      if (first.is_object() && first.contains("id") && first["id"].is_string()) {
        spec.bos_id = find_text({first["id"].get<std::string>()});
        spec.add_bos = spec.bos_id >= 0;
      }
    }
  }
  if (spec.bos_id < 0) spec.bos_id = find_text({"<s>", "<|begin_of_text|>", "<|im_start|>"});
  spec.eos_id = find_text({"</s>", "<|im_end|>", "<|endoftext|>", "<|end_of_text|>"});
  return spec;
}

}  // namespace

tokenizer tokenizer::from_tokenizer_json(std::string_view json_text, std::string_view file_name) {
  const std::string source(file_name);
  tokenizer_spec spec;
  try {
    spec = spec_from_json(json_text, source);
  } catch (const nlohmann::json::exception& e) {  // a structure the checks above did not foresee
    fail_in(source, "JSON", e.what());
  }
  return tokenizer(std::move(spec), source);
}

tokenizer tokenizer::from_tokenizer_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_in(path.string(), "open", "cannot open the file");
  std::ostringstream text;
  text << in.rdbuf();
  return from_tokenizer_json(text.str(), path.string());
}

}  // namespace pagedkv::llama
