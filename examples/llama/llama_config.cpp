#include "llama_config.hpp"

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gguf.hpp"
#include "load_error.hpp"

namespace pagedkv::llama {
namespace {

// Sizes past these are not a model this runner can hold; rejecting them keeps later arithmetic
// (num_heads * head_dim, vocab_size * embedding_dim) far from overflow.
constexpr std::int64_t max_dim = std::int64_t{1} << 20;
constexpr std::int64_t max_vocab = std::int64_t{1} << 24;
constexpr std::int64_t max_context = std::int64_t{1} << 24;

void check_range(std::string_view file, std::string_view field, std::int64_t value, std::int64_t low, std::int64_t high) {
  if (value < low || value > high) fail_in(file, field, "value ", value, " is outside [", low, ", ", high, "]");
}

// Fills head_dim and rope_dim where the source left them out and checks that the numbers fit together.
void finish(llama_config& config, std::string_view file) {
  check_range(file, "embedding_dim", config.embedding_dim, 1, max_dim);
  check_range(file, "ffn_dim", config.ffn_dim, 1, max_dim * 8);
  check_range(file, "num_layers", config.num_layers, 1, 4096);
  check_range(file, "num_heads", config.num_heads, 1, 4096);
  check_range(file, "num_kv_heads", config.num_kv_heads, 1, config.num_heads);
  if (config.num_heads % config.num_kv_heads != 0)
    fail_in(file, "num_kv_heads", config.num_kv_heads, " key/value heads do not divide ", config.num_heads, " query heads");
  if (config.head_dim == 0) {
    if (config.embedding_dim % config.num_heads != 0)
      fail_in(file, "num_heads", config.num_heads, " heads do not divide the embedding width ", config.embedding_dim);
    config.head_dim = config.embedding_dim / config.num_heads;
  }
  check_range(file, "head_dim", config.head_dim, 2, 4096);
  if (config.head_dim % 2 != 0) fail_in(file, "head_dim", "RoPE needs an even head_dim, got ", config.head_dim);
  if (config.rope_dim == 0) config.rope_dim = config.head_dim;
  check_range(file, "rope_dim", config.rope_dim, 2, config.head_dim);
  check_range(file, "vocab_size", config.vocab_size, 1, max_vocab);
  check_range(file, "context_length", config.context_length, 1, max_context);
  if (!(config.rope_theta > 0.0f)) fail_in(file, "rope_theta", "must be positive, got ", config.rope_theta);
  if (!(config.rms_norm_eps > 0.0f)) fail_in(file, "rms_norm_eps", "must be positive, got ", config.rms_norm_eps);
  if (!(config.rope_scaling.factor > 0.0f)) fail_in(file, "rope_scaling.factor", "must be positive, got ", config.rope_scaling.factor);
}

std::int64_t gguf_int(const gguf_file& file, const std::string& key) {
  const auto value = file.get_uint(key);
  if (value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    fail_in(file.file_name(), "metadata '" + key + "'", "value ", value, " is too large");
  return static_cast<std::int64_t>(value);
}

}  // namespace

std::string_view to_string(rope_scaling_type type) noexcept {
  switch (type) {
    case rope_scaling_type::none: return "none";
    case rope_scaling_type::linear: return "linear";
    case rope_scaling_type::yarn: return "yarn";
    case rope_scaling_type::llama3: return "llama3";
  }
  return "unknown";
}

llama_config config_from_gguf(const gguf_file& file) {
  llama_config config;
  config.architecture = file.get_string("general.architecture");
  if (config.architecture != "llama")
    fail_in(file.file_name(), "metadata 'general.architecture'", "architecture '", config.architecture, "' is not supported (only 'llama')");
  const std::string arch = config.architecture + ".";
  config.embedding_dim = gguf_int(file, arch + "embedding_length");
  config.ffn_dim = gguf_int(file, arch + "feed_forward_length");
  config.num_layers = gguf_int(file, arch + "block_count");
  config.num_heads = gguf_int(file, arch + "attention.head_count");
  config.num_kv_heads = file.find(arch + "attention.head_count_kv") ? gguf_int(file, arch + "attention.head_count_kv") : config.num_heads;
  if (file.find(arch + "attention.key_length")) config.head_dim = gguf_int(file, arch + "attention.key_length");
  if (file.find(arch + "rope.dimension_count")) config.rope_dim = gguf_int(file, arch + "rope.dimension_count");
  config.context_length = gguf_int(file, arch + "context_length");
  if (file.find(arch + "vocab_size")) {
    config.vocab_size = gguf_int(file, arch + "vocab_size");
  } else if (const auto* tokens = file.find("tokenizer.ggml.tokens"); tokens && tokens->type == gguf_type::array) {
    config.vocab_size = static_cast<std::int64_t>(std::get<gguf_array>(tokens->data).size());
  } else {
    fail_in(file.file_name(), "metadata '" + arch + "vocab_size'", "missing, and there is no tokenizer.ggml.tokens to count");
  }
  config.rope_theta = static_cast<float>(file.try_get_float(arch + "rope.freq_base").value_or(10000.0));
  config.rms_norm_eps = static_cast<float>(file.get_float(arch + "attention.layer_norm_rms_epsilon"));

  if (const auto type = file.try_get_string(arch + "rope.scaling.type"); type && *type != "none") {
    if (*type == "linear") config.rope_scaling.type = rope_scaling_type::linear;
    else if (*type == "yarn") config.rope_scaling.type = rope_scaling_type::yarn;
    else fail_in(file.file_name(), "metadata '" + arch + "rope.scaling.type'", "RoPE scaling '", *type, "' is not supported");
    config.rope_scaling.factor = static_cast<float>(file.try_get_float(arch + "rope.scaling.factor").value_or(1.0));
    if (file.find(arch + "rope.scaling.original_context_length"))
      config.rope_scaling.original_context_length = gguf_int(file, arch + "rope.scaling.original_context_length");
  } else if (const auto factor = file.try_get_float(arch + "rope.scale_linear")) {
    config.rope_scaling.type = rope_scaling_type::linear;
    config.rope_scaling.factor = static_cast<float>(*factor);
  }
  // llama.cpp stores llama3-style scaling as a precomputed `rope_freqs.weight` tensor instead of
  // metadata; the runner does not use it, so such a file is refused rather than run subtly wrong.
  if (file.find_tensor("rope_freqs.weight"))
    fail_in(file.file_name(), "tensor 'rope_freqs.weight'", "per-frequency RoPE factors (llama3 scaling) are not supported");
  config.tied_embeddings = file.find_tensor("output.weight") == nullptr;
  finish(config, file.file_name());
  return config;
}

llama_config config_from_hf_json(std::string_view json_text, std::string_view file_name) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    fail_at(file_name, "JSON", e.byte, e.what());
  } catch (const nlohmann::json::exception& e) {  // out_of_range: a number too large for a double
    fail_in(file_name, "JSON", e.what());
  }
  if (!json.is_object()) fail_in(file_name, "JSON", "the top level is not an object");
  const std::string file(file_name);
  auto integer = [&](const char* key, std::optional<std::int64_t> fallback = std::nullopt) -> std::int64_t {
    const auto it = json.find(key);
    if (it == json.end() || it->is_null()) {
      if (fallback) return *fallback;
      fail_in(file, key, "the key is missing");
    }
    if (!it->is_number_integer()) fail_in(file, key, "expected an integer, found ", it->type_name());
    return it->get<std::int64_t>();
  };
  auto number = [&](const nlohmann::json& object, const char* key, double fallback) -> float {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) return static_cast<float>(fallback);
    if (!it->is_number()) fail_in(file, key, "expected a number, found ", it->type_name());
    return it->get<float>();
  };

  llama_config config;
  config.architecture = "llama";
  if (const auto it = json.find("model_type"); it != json.end()) {
    if (!it->is_string()) fail_in(file, "model_type", "expected a string, found ", it->type_name());
    const auto type = it->get<std::string>();
    if (type != "llama")
      fail_in(file, "model_type", "model type '", type, "' is not LLaMA-family");
  }
  config.embedding_dim = integer("hidden_size");
  config.ffn_dim = integer("intermediate_size");
  config.num_layers = integer("num_hidden_layers");
  config.num_heads = integer("num_attention_heads");
  config.num_kv_heads = integer("num_key_value_heads", config.num_heads);
  config.head_dim = integer("head_dim", 0);
  config.vocab_size = integer("vocab_size");
  config.context_length = integer("max_position_embeddings");
  config.rope_theta = number(json, "rope_theta", 10000.0);
  config.rms_norm_eps = number(json, "rms_norm_eps", 1e-6);
  if (const auto it = json.find("tie_word_embeddings"); it != json.end() && !it->is_null()) {
    if (!it->is_boolean()) fail_in(file, "tie_word_embeddings", "expected a boolean, found ", it->type_name());
    config.tied_embeddings = it->get<bool>();
  }
  if (const auto it = json.find("rope_scaling"); it != json.end() && !it->is_null()) {
    if (!it->is_object()) fail_in(file, "rope_scaling", "expected an object, found ", it->type_name());
    auto type_it = it->find("rope_type");
    if (type_it == it->end()) type_it = it->find("type");
    if (type_it == it->end() || !type_it->is_string()) fail_in(file, "rope_scaling.rope_type", "missing or not a string");
    const auto type = type_it->get<std::string>();
    if (type == "linear") config.rope_scaling.type = rope_scaling_type::linear;
    else if (type == "yarn") config.rope_scaling.type = rope_scaling_type::yarn;
    else if (type == "llama3") config.rope_scaling.type = rope_scaling_type::llama3;
    else if (type != "default") fail_in(file, "rope_scaling.rope_type", "RoPE scaling '", type, "' is not supported");
    config.rope_scaling.factor = number(*it, "factor", 1.0);
    config.rope_scaling.low_freq_factor = number(*it, "low_freq_factor", 1.0);
    config.rope_scaling.high_freq_factor = number(*it, "high_freq_factor", 4.0);
    if (const auto original = it->find("original_max_position_embeddings"); original != it->end()) {
      if (!original->is_number_integer()) fail_in(file, "rope_scaling.original_max_position_embeddings", "expected an integer");
      config.rope_scaling.original_context_length = original->get<std::int64_t>();
    }
  }
  finish(config, file_name);
  return config;
}

llama_config config_from_hf_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_in(path.string(), "open", "cannot open the file");
  std::ostringstream text;
  text << in.rdbuf();
  return config_from_hf_json(text.str(), path.string());
}

}  // namespace pagedkv::llama
