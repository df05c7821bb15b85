// libFuzzer target: any bytes as a GGUF file. Parsing, every typed metadata read the runner does
// (config, tokenizer), dequantizing every tensor and encoding with the tokenizer must either work
// or throw load_error; anything else (a crash, a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gguf.hpp"
#include "llama_config.hpp"
#include "load_error.hpp"
#include "tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pagedkv::llama;
  try {
    const auto file = gguf_file::parse(std::vector<std::uint8_t>(data, data + size), "fuzz.gguf");
    for (const auto& tensor : file.tensors()) (void)file.dequantize(tensor);
    try {
      (void)config_from_gguf(file);
    } catch (const load_error&) {
    }
    const auto tok = tokenizer::from_gguf(file);
    const auto ids = tok.encode("Hello <|im_start|> w\xC3\xB6rld 123 \xF0\x9F\x99\x82  !");
    (void)tok.decode(ids);
  } catch (const load_error&) {
  }
  return 0;
}
