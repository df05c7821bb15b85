#include "llama_weights.hpp"

#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "gguf.hpp"
#include "load_error.hpp"
#include "safetensors.hpp"

namespace pagedkv::llama {
namespace {

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Fetches a tensor as float32 after checking its shape; names are the source's own.
using tensor_source = std::function<std::vector<float>(const std::string& name, const std::vector<std::int64_t>& shape)>;

struct weight_names {
  std::string token_embedding, output_norm, output;
  std::function<std::string(int layer, const char* which)> layer;
};

llama_weights load(const tensor_source& get, const weight_names& names, const llama_config& c,
                   const std::function<bool(const std::string&)>& has) {
  const std::int64_t d = c.embedding_dim;
  const std::int64_t q_dim = c.num_heads * c.head_dim;
  llama_weights w;
  w.token_embedding = get(names.token_embedding, {c.vocab_size, d});
  w.output_norm = get(names.output_norm, {d});
  if (!c.tied_embeddings || has(names.output)) w.output = get(names.output, {c.vocab_size, d});
  w.layers.resize(static_cast<std::size_t>(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    auto& l = w.layers[static_cast<std::size_t>(i)];
    l.attn_norm = get(names.layer(i, "attn_norm"), {d});
    l.wq = get(names.layer(i, "wq"), {q_dim, d});
    l.wk = get(names.layer(i, "wk"), {c.kv_dim(), d});
    l.wv = get(names.layer(i, "wv"), {c.kv_dim(), d});
    l.wo = get(names.layer(i, "wo"), {d, q_dim});
    l.ffn_norm = get(names.layer(i, "ffn_norm"), {d});
    l.w_gate = get(names.layer(i, "w_gate"), {c.ffn_dim, d});
    l.w_up = get(names.layer(i, "w_up"), {c.ffn_dim, d});
    l.w_down = get(names.layer(i, "w_down"), {d, c.ffn_dim});
  }
  return w;
}

}  // namespace

void unpermute_rope_rows(std::vector<float>& matrix, std::int64_t num_heads, std::int64_t head_dim, std::int64_t columns) {
  const std::vector<float> permuted = matrix;
  const auto half = head_dim / 2;
  const auto row = [&](std::int64_t r) { return static_cast<std::size_t>(r * columns); };
  for (std::int64_t h = 0; h < num_heads; ++h)
    for (std::int64_t i = 0; i < half; ++i)
      for (std::int64_t s = 0; s < 2; ++s)
        std::copy_n(permuted.begin() + static_cast<std::ptrdiff_t>(row(h * head_dim + 2 * i + s)), columns,
                    matrix.begin() + static_cast<std::ptrdiff_t>(row(h * head_dim + s * half + i)));
}

llama_weights load_llama_weights(const gguf_file& file, const llama_config& config) {
  const auto get = [&](const std::string& name, const std::vector<std::int64_t>& shape) {
    const auto* tensor = file.find_tensor(name);
    if (!tensor) fail_in(file.file_name(), "tensor '" + name + "'", "missing");
    if (tensor->shape() != shape)
      fail_at(file.file_name(), "tensor '" + name + "' dims", tensor->info_offset, "shape ", shape_string(tensor->shape()),
              " does not match the config's ", shape_string(shape));
    return file.dequantize(*tensor);
  };
  static const std::map<std::string, std::string, std::less<>> layer_names = {
      {"attn_norm", "attn_norm"}, {"wq", "attn_q"}, {"wk", "attn_k"},       {"wv", "attn_v"},     {"wo", "attn_output"},
      {"ffn_norm", "ffn_norm"},   {"w_gate", "ffn_gate"}, {"w_up", "ffn_up"}, {"w_down", "ffn_down"}};
  weight_names names{"token_embd.weight", "output_norm.weight", "output.weight",
                     [](int layer, const char* which) { return "blk." + std::to_string(layer) + "." + layer_names.at(which) + ".weight"; }};
  auto weights = load(get, names, config, [&](const std::string& name) { return file.find_tensor(name) != nullptr; });
  for (auto& layer : weights.layers) {
    unpermute_rope_rows(layer.wq, config.num_heads, config.head_dim, config.embedding_dim);
    unpermute_rope_rows(layer.wk, config.num_kv_heads, config.head_dim, config.embedding_dim);
  }
  return weights;
}

llama_weights load_llama_weights(const std::vector<const safetensors_file*>& shards, const llama_config& config) {
  const auto find = [&](const std::string& name) -> std::pair<const safetensors_file*, const safetensors_tensor*> {
    for (const auto* shard : shards)
      if (const auto* tensor = shard->find_tensor(name)) return {shard, tensor};
    return {nullptr, nullptr};
  };
  const auto get = [&](const std::string& name, const std::vector<std::int64_t>& shape) {
    const auto [shard, tensor] = find(name);
    if (!tensor) fail_in(shards.empty() ? std::string("safetensors") : shards.front()->file_name(), "tensor '" + name + "'", "missing");
    if (tensor->shape != shape)
      fail_at(shard->file_name(), "tensor '" + name + "' shape", tensor->data_offset, "shape ", shape_string(tensor->shape),
              " does not match the config's ", shape_string(shape));
    return shard->to_float(*tensor);
  };
  static const std::map<std::string, std::string, std::less<>> layer_names = {
      {"attn_norm", "input_layernorm"},  {"wq", "self_attn.q_proj"}, {"wk", "self_attn.k_proj"},
      {"wv", "self_attn.v_proj"},        {"wo", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
      {"w_gate", "mlp.gate_proj"},       {"w_up", "mlp.up_proj"},    {"w_down", "mlp.down_proj"}};
  weight_names names{"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", [](int layer, const char* which) {
                       return "model.layers." + std::to_string(layer) + "." + layer_names.at(which) + ".weight";
                     }};
  return load(get, names, config, [&](const std::string& name) { return find(name).second != nullptr; });
}

hf_checkpoint load_hf_checkpoint(const std::filesystem::path& directory) {
  hf_checkpoint checkpoint;
  checkpoint.config = config_from_hf_json_file(directory / "config.json");
  std::vector<safetensors_file> files;
  const auto index_path = directory / "model.safetensors.index.json";
  if (std::filesystem::exists(index_path)) {
    std::ifstream in(index_path, std::ios::binary);
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(in);
    } catch (const nlohmann::json::parse_error& e) {
      fail_at(index_path.string(), "JSON", e.byte, e.what());
    } catch (const nlohmann::json::exception& e) {  // out_of_range: a number too large for a double
      fail_in(index_path.string(), "JSON", e.what());
    }
    const auto map = index.find("weight_map");
    if (map == index.end() || !map->is_object()) fail_in(index_path.string(), "weight_map", "missing or not an object");
    std::set<std::string> shard_names;
    for (const auto& [tensor, shard] : map->items()) {
      if (!shard.is_string()) fail_in(index_path.string(), "weight_map." + tensor, "expected a file name");
      const auto name = shard.get<std::string>();
      if (name.find('/') != std::string::npos || name.find('\\') != std::string::npos || name == "..")
        fail_in(index_path.string(), "weight_map." + tensor, "shard '", name, "' is not a file in the model directory");
      shard_names.insert(name);
    }
    for (const auto& name : shard_names) files.push_back(safetensors_file::open(directory / name));
  } else {
    files.push_back(safetensors_file::open(directory / "model.safetensors"));
  }
  std::vector<const safetensors_file*> shards;
  for (const auto& file : files) shards.push_back(&file);
  checkpoint.weights = load_llama_weights(shards, checkpoint.config);
  return checkpoint;
}

}  // namespace pagedkv::llama
