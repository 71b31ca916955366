// A real Strata API server over a scripted model, for driving tool loops with real clients: the
// shared dreams model knows nothing of tools, so this "model" answers as Qwen3 would. Its prompt
// is rendered by Qwen3's real template; with no tool result in the prompt it reasons and calls
// get_weather, with one it answers from it. Prints "listening on http://127.0.0.1:PORT" and serves
// until its standard input closes. Usage: scripted_tool_server SHARED_DIR
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "api/server.h"
#include "fake_generator.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

using strata::engine::Token;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: scripted_tool_server SHARED_DIR\n");
    return 2;
  }
  const std::string shared = argv[1];
  const auto file = strata::gguf::File::open(shared + "/models/aidreams260K.gguf");
  const auto tokenizer = strata::tokenizer::Tokenizer::from_gguf(*file);
  const std::string chat_template = read_file(shared + "/templates/Qwen-Qwen3-0.6B.jinja");

  strata::api::testing::FakeGenerator::Options fake;
  fake.limits.context_size = 8192;
  fake.script = [&](std::span<const Token> prompt) {
    const std::string text = tokenizer->decode(prompt);
    const bool answered = text.find("<tool_response>") != std::string::npos;
    const std::string answer =
        answered ? "<think>\nThe tool says it is sunny.\n</think>\n\nIt is 24 °C and sunny in Paris."
                 : "<think>\nI should look the weather up.\n</think>\n\n<tool_call>\n"
                   "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    return tokenizer->encode(answer, false, false);
  };
  strata::api::testing::FakeGenerator generator(fake);

  strata::api::ServerOptions options;
  options.port = 0;
  strata::api::Server server(generator, *tokenizer, "scripted-qwen3", chat_template, options);
  server.start();
  std::printf("listening on http://127.0.0.1:%d\n", server.port());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  server.stop();
  generator.shutdown();
  return 0;
}
