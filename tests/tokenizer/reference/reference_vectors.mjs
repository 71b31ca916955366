// Test vectors for each family in families.json, in llama.cpp's format (see
// ../../../../shared/vocab/README.md), from the model's real tokenizer files and Hugging Face's
// tokenizers.js as the npm packages ship them:
//   ggml-vocab-NAME.gguf          the vocabulary, written by make_vocab.py from tokenizer.json
//   ggml-vocab-NAME.gguf.inp      the texts of corpus.json
//   ggml-vocab-NAME.gguf.out      their ids: encode(text, add_special_tokens=false), which turns
//                                 special-token text such as <|im_start|> into that token
//   ggml-vocab-NAME.gguf.decoded  decode(encode(text)) with special tokens kept as text and no
//                                 clean-up: the text as the tokenizer normalizes it
// Usage: node reference_vectors.mjs OUT_DIR
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const separator = "\n__ggml_vocab_test__\n";

const outDir = process.argv[2];
if (!outDir) {
  console.error("usage: node reference_vectors.mjs OUT_DIR");
  process.exit(2);
}
mkdirSync(outDir, { recursive: true });

const readJson = (name) => JSON.parse(readFileSync(join(here, name), "utf8"));
const families = readJson("families.json");
const corpus = readJson("corpus.json");
const joinTests = (texts) => texts.map((text) => text + separator).join("");

for (const family of families) {
  const started = Date.now();
  const packageDir = join(here, "node_modules", family.package);
  let module;
  try {
    module = await import(family.package);
  } catch (error) {
    console.error(`${family.package} is not installed in ${here}: run scripts/install-deps.sh`);
    throw error;
  }
  const vocabulary = join(outDir, `ggml-vocab-${family.name}.gguf`);
  execFileSync(process.env.PYTHON ?? "python3", [join(here, "make_vocab.py"), join(packageDir, "models"), family.name,
                           family.model, family.pre, vocabulary], { stdio: "inherit" });

  const tokenizer = module.fromPreTrained();
  const ids = corpus.map(({ text }) => tokenizer.encode(text, { add_special_tokens: false }));
  // tokenizers.js refuses to decode no tokens.
  const decoded = ids.map((tokens) => tokens.length === 0 ? "" :
    tokenizer.decode(tokens, { skip_special_tokens: false, clean_up_tokenization_spaces: false }));
  writeFileSync(`${vocabulary}.inp`, joinTests(corpus.map(({ text }) => text)));
  writeFileSync(`${vocabulary}.out`, ids.map((tokens) => tokens.map((id) => ` ${id}`).join("") + "\n").join(""));
  writeFileSync(`${vocabulary}.decoded`, joinTests(decoded));
  console.log(`${family.name}: ${corpus.length} texts, ${ids.flat().length} tokens, ` +
              `${((Date.now() - started) / 1000).toFixed(1)} s`);
}
