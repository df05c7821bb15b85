#include "llama_config.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
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

// Hugging Face's get_mscale (modeling_rope_utils.py, _compute_yarn_parameters).
double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// Fills the context yarn and llama3 scale from and yarn's attention factor where the source left
// them out, as Hugging Face does, and checks the numbers the frequencies are made of.
void finish_rope_scaling(llama_config& config, std::string_view file) {
  rope_scaling_config& rope = config.rope_scaling;
  if (!(rope.factor > 0.0) || !std::isfinite(rope.factor))
    fail_in(file, "rope_scaling.factor", "must be positive, got ", rope.factor);
  if (rope.type != rope_scaling_type::yarn && rope.type != rope_scaling_type::llama3) return;
  if (rope.original_context_length == 0) rope.original_context_length = config.context_length;
  check_range(file, "rope_scaling.original_context_length", rope.original_context_length, 1, max_context);
  if (rope.type == rope_scaling_type::yarn && rope.attention_factor == 0.0) {
    rope.attention_factor = rope.mscale != 0.0 && rope.mscale_all_dim != 0.0
                                ? yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim)
                                : yarn_mscale(rope.factor, 1.0);
    if (!(rope.attention_factor > 0.0) || !std::isfinite(rope.attention_factor))
      fail_in(file, "rope_scaling.mscale", "mscale ", rope.mscale, " and mscale_all_dim ", rope.mscale_all_dim,
              " give the attention factor ", rope.attention_factor);
  }
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
  if (!(config.rope_theta > 0.0) || !std::isfinite(config.rope_theta))
    fail_in(file, "rope_theta", "must be positive, got ", config.rope_theta);
  if (!(config.rms_norm_eps > 0.0f)) fail_in(file, "rms_norm_eps", "must be positive, got ", config.rms_norm_eps);
  finish_rope_scaling(config, file);
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
  config.rope_theta = file.try_get_float(arch + "rope.freq_base").value_or(10000.0);
  config.rms_norm_eps = static_cast<float>(file.get_float(arch + "attention.layer_norm_rms_epsilon"));

  if (const auto type = file.try_get_string(arch + "rope.scaling.type"); type && *type != "none") {
    if (*type == "linear") config.rope_scaling.type = rope_scaling_type::linear;
    else if (*type == "yarn") config.rope_scaling.type = rope_scaling_type::yarn;
    else fail_in(file.file_name(), "metadata '" + arch + "rope.scaling.type'", "RoPE scaling '", *type, "' is not supported");
    config.rope_scaling.factor = file.try_get_float(arch + "rope.scaling.factor").value_or(1.0);
    if (file.find(arch + "rope.scaling.original_context_length"))
      config.rope_scaling.original_context_length = gguf_int(file, arch + "rope.scaling.original_context_length");
  } else if (const auto factor = file.try_get_float(arch + "rope.scale_linear")) {
    config.rope_scaling.type = rope_scaling_type::linear;
    config.rope_scaling.factor = *factor;
  }
  config.tied_embeddings = file.find_tensor("output.weight") == nullptr;
  finish(config, file.file_name());
  // llama.cpp writes llama3 scaling not as metadata but as a `rope_freqs.weight` tensor of
  // per-frequency divisors (convert_hf_to_gguf.py precomputes Hugging Face's formula).
  if (const auto* freqs = file.find_tensor("rope_freqs.weight")) {
    const std::string field = "tensor 'rope_freqs.weight'";
    if (config.rope_scaling.type != rope_scaling_type::none)
      fail_in(file.file_name(), field, "per-frequency factors together with ", to_string(config.rope_scaling.type),
              " scaling are not supported");
    if (freqs->shape() != std::vector<std::int64_t>{config.rope_dim / 2})
      fail_at(file.file_name(), field, freqs->info_offset, "expected ", config.rope_dim / 2, " values, one per frequency");
    config.rope_scaling.frequency_divisors = file.dequantize(*freqs);
    for (const float divisor : config.rope_scaling.frequency_divisors)
      if (!(divisor > 0.0f) || !std::isfinite(divisor))
        fail_at(file.file_name(), field, freqs->data_offset, "divisor ", divisor, " is not positive and finite");
  }
  return config;
}

namespace {

// The RoPE settings of a config.json in either format. transformers 5 writes "rope_parameters"
// with rope_type and rope_theta inside; 4.x wrote a top-level "rope_theta" and a "rope_scaling"
// object. As transformers 5.17 reads them (convert_rope_params_to_dict, standardize_rope_params):
// a non-empty rope_scaling replaces rope_parameters, the object's rope_theta wins over the top-level
// one, "type" stands in for "rope_type", and for llama3 and yarn a top-level
// original_max_position_embeddings wins over the object's, which defaults to max_position_embeddings.
void read_hf_rope(const nlohmann::json& json, const std::string& file, llama_config& config) {
  const char* object_name = "rope_scaling";
  auto object = json.find(object_name);
  if (object == json.end() || object->is_null() || (object->is_object() && object->empty())) {
    object_name = "rope_parameters";
    object = json.find(object_name);
  }
  if (object == json.end() || object->is_null()) return;
  if (!object->is_object()) fail_in(file, object_name, "expected an object, found ", object->type_name());
  const auto field = [&](const char* key) { return std::string(object_name) + "." + key; };
  // A number of the object: `fallback` when absent or null (nullopt: the key is required).
  const auto number = [&](const char* key, std::optional<double> fallback) -> double {
    const auto it = object->find(key);
    if (it == object->end() || it->is_null()) {
      if (!fallback) fail_in(file, field(key), "the key is missing");
      return *fallback;
    }
    if (!it->is_number()) fail_in(file, field(key), "expected a number, found ", it->type_name());
    return it->get<double>();
  };
  const auto positive = [&](const char* key, std::optional<double> fallback) {
    const double value = number(key, fallback);
    if (!(value > 0.0) || !std::isfinite(value)) fail_in(file, field(key), "must be positive, got ", value);
    return value;
  };

  auto type_it = object->find("rope_type");
  if (type_it == object->end()) type_it = object->find("type");
  std::string type = "default";
  if (type_it != object->end()) {
    if (!type_it->is_string()) fail_in(file, field("rope_type"), "expected a string, found ", type_it->type_name());
    type = type_it->get<std::string>();
  }
  rope_scaling_config& rope = config.rope_scaling;
  if (type == "linear") rope.type = rope_scaling_type::linear;
  else if (type == "yarn") rope.type = rope_scaling_type::yarn;
  else if (type == "llama3") rope.type = rope_scaling_type::llama3;
  else if (type != "default") fail_in(file, field("rope_type"), "RoPE scaling '", type, "' is not supported");

  if (object->contains("rope_theta")) config.rope_theta = number("rope_theta", std::nullopt);
  // Hugging Face's LLaMA rotates whole heads; a partial rotary factor would break its own forward.
  if (const double partial = number("partial_rotary_factor", 1.0); partial != 1.0)
    fail_in(file, field("partial_rotary_factor"), "partial rotary embeddings (", partial, ") are not supported");
  if (rope.type == rope_scaling_type::none) return;

  if (rope.type == rope_scaling_type::llama3 || rope.type == rope_scaling_type::yarn) {
    const char* key = "original_max_position_embeddings";
    const auto top = json.find(key);
    const auto own = object->find(key);
    const bool use_top = top != json.end() && !top->is_null();
    const nlohmann::json* value = use_top ? &*top : own != object->end() ? &*own : nullptr;
    const std::string name = use_top ? std::string(key) : field(key);
    if (!value || value->is_null()) {
      rope.original_context_length = config.context_length;
    } else {
      if (!value->is_number_integer()) fail_in(file, name, "expected an integer, found ", value->type_name());
      rope.original_context_length = value->get<std::int64_t>();
      check_range(file, name, rope.original_context_length, 1, max_context);
    }
  }
  if (rope.type == rope_scaling_type::yarn) {
    // Null factor: Hugging Face takes the ratio of the contexts (DeepSeek-V3's configs).
    const auto it = object->find("factor");
    if (it == object->end()) fail_in(file, field("factor"), "the key is missing");
    rope.factor = positive("factor", double(config.context_length) / double(rope.original_context_length));
    // Hugging Face writes `beta_fast or 32`: zero means the default too.
    rope.beta_fast = number("beta_fast", 0.0);
    if (rope.beta_fast == 0.0) rope.beta_fast = 32.0;
    rope.beta_slow = number("beta_slow", 0.0);
    if (rope.beta_slow == 0.0) rope.beta_slow = 1.0;
    if (!(rope.beta_fast > 0.0)) fail_in(file, field("beta_fast"), "must be positive, got ", rope.beta_fast);
    if (!(rope.beta_slow > 0.0)) fail_in(file, field("beta_slow"), "must be positive, got ", rope.beta_slow);
    rope.mscale = number("mscale", 0.0);
    rope.mscale_all_dim = number("mscale_all_dim", 0.0);
    if (object->contains("attention_factor") && !object->at("attention_factor").is_null())
      rope.attention_factor = positive("attention_factor", std::nullopt);
    if (const auto truncate = object->find("truncate"); truncate != object->end() && !truncate->is_null()) {
      if (!truncate->is_boolean()) fail_in(file, field("truncate"), "expected a boolean, found ", truncate->type_name());
      rope.truncate = truncate->get<bool>();
    }
    if (config.rope_theta == 1.0) fail_in(file, "rope_theta", "yarn divides by log(rope_theta), which is 0");
    return;
  }
  rope.factor = positive("factor", std::nullopt);
  if (rope.type == rope_scaling_type::llama3) {
    rope.low_freq_factor = positive("low_freq_factor", std::nullopt);
    rope.high_freq_factor = positive("high_freq_factor", std::nullopt);
    if (!(rope.high_freq_factor > rope.low_freq_factor))
      fail_in(file, field("high_freq_factor"), rope.high_freq_factor, " must exceed low_freq_factor ", rope.low_freq_factor);
  }
}

/// Mistral: sliding_window (null: none) on every layer, as transformers' MistralModel applies it
/// (it ignores layer_types). Ministral: on the layers layer_types names "sliding_attention".
void read_hf_sliding_window(const nlohmann::json& json, const std::string& file, const std::string& model_type,
                            llama_config& config) {
  const auto window_it = json.find("sliding_window");
  std::int64_t window = 0;
  if (window_it != json.end() && !window_it->is_null()) {
    if (!window_it->is_number_integer()) fail_in(file, "sliding_window", "expected an integer, found ", window_it->type_name());
    window = window_it->get<std::int64_t>();
    check_range(file, "sliding_window", window, 1, max_context);
  }
  std::vector<std::int32_t> windows(std::size_t(std::max<std::int64_t>(config.num_layers, 0)), std::int32_t(window));
  const auto types_it = json.find("layer_types");
  if (model_type == "ministral" && types_it != json.end() && !types_it->is_null()) {
    if (!types_it->is_array() || std::int64_t(types_it->size()) != config.num_layers)
      fail_in(file, "layer_types", "expected an array of num_hidden_layers = ", config.num_layers, " strings");
    for (std::size_t l = 0; l < windows.size(); ++l) {
      const nlohmann::json& type = (*types_it)[l];
      const std::string name = type.is_string() ? type.get<std::string>() : type.dump();
      if (name == "full_attention") {
        windows[l] = 0;
      } else if (name != "sliding_attention") {
        fail_in(file, "layer_types[" + std::to_string(l) + "]", "layer type ", name,
                " is not supported (full_attention, sliding_attention)");
      } else if (window == 0) {
        fail_in(file, "layer_types[" + std::to_string(l) + "]", "sliding_attention without a sliding_window");
      }
    }
  }
  if (std::any_of(windows.begin(), windows.end(), [](std::int32_t w) { return w > 0; })) config.layer_windows = windows;
}

}  // namespace

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
  auto number = [&](const nlohmann::json& object, const char* key, double fallback) -> double {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) return fallback;
    if (!it->is_number()) fail_in(file, key, "expected a number, found ", it->type_name());
    return it->get<double>();
  };

  llama_config config;
  config.architecture = "llama";
  std::string model_type = "llama";
  if (const auto it = json.find("model_type"); it != json.end()) {
    if (!it->is_string()) fail_in(file, "model_type", "expected a string, found ", it->type_name());
    model_type = it->get<std::string>();
    if (model_type != "llama" && model_type != "mistral" && model_type != "ministral")
      fail_in(file, "model_type", "model type '", model_type, "' is not LLaMA-family (llama, mistral, ministral)");
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
  config.rms_norm_eps = float(number(json, "rms_norm_eps", 1e-6));
  if (const auto it = json.find("tie_word_embeddings"); it != json.end() && !it->is_null()) {
    if (!it->is_boolean()) fail_in(file, "tie_word_embeddings", "expected a boolean, found ", it->type_name());
    config.tied_embeddings = it->get<bool>();
  }
  read_hf_rope(json, file, config);
  finish(config, file_name);
  if (model_type != "llama") read_hf_sliding_window(json, file, model_type, config);  // num_layers checked
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
