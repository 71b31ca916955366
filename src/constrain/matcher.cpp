#include "constrain/matcher.h"

#include <algorithm>
#include <tuple>

#include "tokenizer/tokenizer.h"

namespace strata::constrain {

namespace {

// Transition tables (1 KiB each) a matcher keeps before it forgets them all and computes again
// what it needs; and masks, likewise.
constexpr size_t kMaxTransitionTables = 16384;
constexpr size_t kMaxMasks = 64;

uint64_t pair_key(int a, int b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

// Bytes in the UTF-8 sequence that `lead` starts; 0 for a byte that starts none.
int sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether `byte` may follow `lead` as its second byte (no overlong forms, surrogates, or code
// points above U+10FFFF).
bool valid_second(uint8_t lead, uint8_t byte) {
  if ((byte & 0xC0) != 0x80) return false;
  if (lead == 0xE0) return byte >= 0xA0;
  if (lead == 0xED) return byte <= 0x9F;
  if (lead == 0xF0) return byte >= 0x90;
  if (lead == 0xF4) return byte <= 0x8F;
  return true;
}

char32_t decode(const uint8_t* bytes, int length) {
  char32_t cp = length == 1 ? bytes[0] : length == 2 ? bytes[0] & 0x1F : length == 3 ? bytes[0] & 0x0F : bytes[0] & 0x07;
  for (int i = 1; i < length; ++i) cp = (cp << 6) | (bytes[i] & 0x3F);
  return cp;
}

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> pieces, std::vector<Token> end_tokens)
    : pieces_(std::move(pieces)), is_end_(pieces_.size(), 0) {
  for (Token t : end_tokens) {
    if (t < 0 || static_cast<size_t>(t) >= pieces_.size()) throw std::invalid_argument("vocabulary: end token outside it");
    if (is_end_[static_cast<size_t>(t)] == 0) end_tokens_.push_back(t);
    is_end_[static_cast<size_t>(t)] = 1;
  }
  std::vector<Token> order;
  for (size_t t = 0; t < pieces_.size(); ++t) {
    const size_t length = pieces_[t].size();
    if (length > 0 && length < 65536 && is_end_[t] == 0) order.push_back(static_cast<Token>(t));
  }
  std::sort(order.begin(), order.end(), [&](Token a, Token b) { return std::tie(pieces_[static_cast<size_t>(a)], a) < std::tie(pieces_[static_cast<size_t>(b)], b); });
  // Sorted pieces put every prefix before its extensions, so the trie grows in preorder along
  // one path from the root.
  std::vector<uint32_t> path;  // node per depth - 1
  std::vector<std::vector<Token>> tokens_at;
  std::string current;
  for (Token t : order) {
    const std::string& piece = pieces_[static_cast<size_t>(t)];
    size_t common = 0;
    while (common < current.size() && common < piece.size() && current[common] == piece[common]) ++common;
    while (path.size() > common) {
      trie_.subtree_end[path.back()] = static_cast<uint32_t>(trie_.byte.size());
      path.pop_back();
    }
    current = piece;
    for (size_t i = common; i < piece.size(); ++i) {
      path.push_back(static_cast<uint32_t>(trie_.byte.size()));
      trie_.byte.push_back(static_cast<uint8_t>(piece[i]));
      trie_.depth.push_back(static_cast<uint16_t>(i + 1));
      trie_.subtree_end.push_back(0);
      tokens_at.emplace_back();
    }
    tokens_at[path.back()].push_back(t);
  }
  for (uint32_t n : path) trie_.subtree_end[n] = static_cast<uint32_t>(trie_.byte.size());
  trie_.token_begin.push_back(0);
  for (const std::vector<Token>& tokens : tokens_at) {
    trie_.token_of.insert(trie_.token_of.end(), tokens.begin(), tokens.end());
    trie_.token_begin.push_back(static_cast<uint32_t>(trie_.token_of.size()));
  }
}

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const tokenizer::Tokenizer& tokenizer) {
  std::vector<std::string> pieces(static_cast<size_t>(tokenizer.vocab_size()));
  std::vector<Token> ends;
  for (Token t = 0; t < tokenizer.vocab_size(); ++t) {
    pieces[static_cast<size_t>(t)] = tokenizer.token_piece(t);
    if (tokenizer.is_end_of_generation(t)) ends.push_back(t);
  }
  return std::make_shared<const Vocabulary>(std::move(pieces), std::move(ends));
}

Matcher::Matcher(const Grammar& grammar, std::shared_ptr<const Vocabulary> vocabulary)
    : vocabulary_(std::move(vocabulary)) {
  if (grammar.root < 0 || static_cast<size_t>(grammar.root) >= grammar.rules.size()) {
    throw GrammarError("grammar: no root rule");
  }
  // Position 0 refers to the root, position 1 ends there.
  flat_.push_back({Flat::Kind::Rule, grammar.root});
  flat_.push_back({Flat::Kind::End, 0});
  alternatives_.resize(grammar.rules.size());
  for (size_t r = 0; r < grammar.rules.size(); ++r) {
    for (const Sequence& seq : grammar.rules[r].alternatives) {
      alternatives_[r].push_back(static_cast<int>(flat_.size()));
      for (const Element& e : seq) {
        if (e.kind == Element::Kind::Rule) {
          flat_.push_back({Flat::Kind::Rule, e.rule});
        } else {
          flat_.push_back({Flat::Kind::Chars, static_cast<int>(classes_.size())});
          classes_.push_back(e);
        }
      }
      flat_.push_back({Flat::Kind::End, 0});
    }
  }
  nodes_.push_back({-1, -1});  // 0: the empty stack, everything matched
  std::vector<int> start;
  expand_into(0, 0, start);
  const int stacks = stack_set(std::move(start));
  if (stacks < 0) throw GrammarError("grammar: it accepts nothing");
  state_ = byte_state({stacks, 0, {}});
}

Matcher::~Matcher() = default;

int Matcher::node(int pos, int parent) {
  const auto [it, added] = node_ids_.try_emplace(pair_key(pos, parent), static_cast<int>(nodes_.size()));
  if (added) nodes_.push_back({pos, parent});
  return it->second;
}

// Adds the stacks that `pos` (then `parent`) reaches without reading: each has a character
// class on top, or is the empty stack.
void Matcher::expand_into(int pos, int parent, std::vector<int>& out, int depth) {
  if (out.size() > kMaxParses) throw GrammarError("grammar: too ambiguous (more than " + std::to_string(kMaxParses) + " parses at once)");
  if (depth > kMaxExpansionDepth) {
    throw GrammarError("grammar: more than " + std::to_string(kMaxExpansionDepth) + " rules deep before a character");
  }
  const Flat& f = flat_[static_cast<size_t>(pos)];
  if (f.kind == Flat::Kind::End) {
    if (parent == 0) {
      out.push_back(0);
    } else {
      const StackNode p = nodes_[static_cast<size_t>(parent)];
      expand_into(p.pos, p.parent, out, depth + 1);
    }
    return;
  }
  if (f.kind == Flat::Kind::Chars) {
    out.push_back(node(pos, parent));
    return;
  }
  // A rule that ends its sequence returns straight to the parent, so loops do not deepen.
  const int after = flat_[static_cast<size_t>(pos) + 1].kind == Flat::Kind::End ? parent : node(pos + 1, parent);
  for (int start : alternatives_[static_cast<size_t>(f.index)]) expand_into(start, after, out, depth + 1);
}

int Matcher::stack_set(std::vector<int> nodes) {
  if (nodes.empty()) return kDead;
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  if (const auto found = stack_set_ids_.find(nodes); found != stack_set_ids_.end()) return found->second;
  const int id = static_cast<int>(stack_sets_.size());
  stack_set_ids_.emplace(nodes, id);
  stack_sets_.push_back(std::move(nodes));
  return id;
}

int Matcher::advance(int stacks, char32_t cp) {
  std::vector<int> matched;
  for (int n : stack_sets_[static_cast<size_t>(stacks)]) {
    if (n != 0 && classes_[static_cast<size_t>(flat_[static_cast<size_t>(nodes_[static_cast<size_t>(n)].pos)].index)].matches(cp)) {
      matched.push_back(n);
    }
  }
  return past(matched);
}

int Matcher::past(const std::vector<int>& matched) {
  std::vector<int> next;
  for (int n : matched) {
    const StackNode s = nodes_[static_cast<size_t>(n)];
    expand_into(s.pos + 1, s.parent, next);
  }
  return stack_set(std::move(next));
}

int Matcher::byte_state(const ByteState& s) {
  uint32_t pending = s.owed > 0 ? 0x80 | s.owed : s.pending_length;  // the two forms never collide
  for (int i = 0; i < s.pending_length; ++i) pending = (pending << 8) | s.pending[static_cast<size_t>(i)];
  const auto [it, added] = state_ids_.try_emplace(pair_key(s.stacks, static_cast<int>(pending)), static_cast<int>(states_.size()));
  if (added) {
    states_.push_back(s);
    transitions_.emplace_back();
  }
  return it->second;
}

int Matcher::step(int state, uint8_t byte) {
  std::unique_ptr<std::array<int, 256>>& table = transitions_[static_cast<size_t>(state)];
  if (!table) {
    if (transition_tables_ >= kMaxTransitionTables) {
      for (auto& t : transitions_) t.reset();
      transition_tables_ = 0;
    }
    table = std::make_unique<std::array<int, 256>>();
    table->fill(kUnknown);
    ++transition_tables_;
  }
  int& next = (*table)[byte];
  // compute_step may add states, moving transitions_, but never frees this table.
  if (next == kUnknown) next = compute_step(state, byte);
  return next;
}

int Matcher::compute_step(int state, uint8_t byte) {
  const ByteState s = states_[static_cast<size_t>(state)];
  if (s.owed > 0) {
    if ((byte & 0xC0) != 0x80) return kDead;
    return byte_state({s.stacks, 0, {}, static_cast<uint8_t>(s.owed - 1)});
  }
  std::array<uint8_t, 4> bytes{};
  std::copy_n(s.pending.begin(), s.pending_length, bytes.begin());
  bytes[s.pending_length] = byte;
  const int have = s.pending_length + 1;
  const int length = sequence_length(bytes[0]);
  if (length == 0) return kDead;
  if (have == 2 && !valid_second(bytes[0], byte)) return kDead;
  if (have > 2 && (byte & 0xC0) != 0x80) return kDead;
  if (have == length) {
    const int stacks = advance(s.stacks, decode(bytes.data(), length));
    return stacks < 0 ? kDead : byte_state({stacks, 0, {}});
  }
  // A character begun: go on if some stack can take a code point that starts with these bytes.
  std::array<uint8_t, 4> low = bytes, high = bytes;
  for (int i = have; i < length; ++i) {
    low[static_cast<size_t>(i)] = 0x80;
    high[static_cast<size_t>(i)] = 0xBF;
  }
  if (have == 1) {  // the second byte's range narrows for some leads
    if (bytes[0] == 0xE0) low[1] = 0xA0;
    if (bytes[0] == 0xED) high[1] = 0x9F;
    if (bytes[0] == 0xF0) low[1] = 0x90;
    if (bytes[0] == 0xF4) high[1] = 0x8F;
  }
  const char32_t first = decode(low.data(), length), last = decode(high.data(), length);
  bool possible = false, uniform = true;
  std::vector<int> matched;
  for (int n : stack_sets_[static_cast<size_t>(s.stacks)]) {
    if (n == 0) continue;
    const Element& cls = classes_[static_cast<size_t>(flat_[static_cast<size_t>(nodes_[static_cast<size_t>(n)].pos)].index)];
    const bool any = cls.matches_any(first, last);
    possible = possible || any;
    if (any && cls.matches_all(first, last)) {
      matched.push_back(n);
    } else if (any) {
      uniform = false;
    }
  }
  if (!possible) return kDead;
  // The lead's constraint on the second byte is checked above, so only free continuation
  // bytes remain.
  const bool free_rest = have >= 2 || (bytes[0] != 0xE0 && bytes[0] != 0xED && bytes[0] != 0xF0 && bytes[0] != 0xF4);
  if (uniform && free_rest) {
    const int stacks = past(matched);
    return stacks < 0 ? kDead : byte_state({stacks, 0, {}, static_cast<uint8_t>(length - have)});
  }
  ByteState next{s.stacks, static_cast<uint8_t>(have), {}};
  std::copy_n(bytes.begin(), have, next.pending.begin());
  return byte_state(next);
}

int Matcher::walk(std::string_view bytes) {
  int state = state_;
  for (char c : bytes) {
    state = step(state, static_cast<uint8_t>(c));
    if (state < 0) return kDead;
  }
  return state;
}

bool Matcher::state_complete(int state) const {
  const ByteState& s = states_[static_cast<size_t>(state)];
  return s.pending_length == 0 && s.owed == 0 && stack_sets_[static_cast<size_t>(s.stacks)].front() == 0;
}

bool Matcher::complete() const { return state_complete(state_); }

bool Matcher::finished() const {
  const ByteState& s = states_[static_cast<size_t>(state_)];
  const std::vector<int>& stacks = stack_sets_[static_cast<size_t>(s.stacks)];
  return s.pending_length == 0 && s.owed == 0 && stacks.size() == 1 && stacks[0] == 0;
}

bool Matcher::accepts(std::string_view bytes) { return walk(bytes) >= 0; }

bool Matcher::accept_bytes(std::string_view bytes) {
  const int next = walk(bytes);
  if (next < 0) return false;
  state_ = next;
  return true;
}

bool Matcher::accept_token(Token token) {
  if (token < 0 || token >= vocabulary_->size()) return false;
  if (vocabulary_->is_end(token)) return complete();
  const std::string& piece = vocabulary_->piece(token);
  return !piece.empty() && accept_bytes(piece);
}

const std::vector<uint8_t>& Matcher::allowed_tokens() {
  if (const auto cached = masks_.find(state_); cached != masks_.end()) return cached->second;
  if (masks_.size() >= kMaxMasks) masks_.clear();
  std::vector<uint8_t>& mask = masks_[state_];
  mask.assign(static_cast<size_t>(vocabulary_->size()), 0);
  const Vocabulary::Trie& trie = vocabulary_->trie();
  const size_t count = trie.byte.size();
  size_t i = 0;
  walk_states_.assign(1, state_);
  while (i < count) {
    const size_t depth = trie.depth[i];
    const int next = step(walk_states_[depth - 1], trie.byte[i]);
    if (next < 0) {
      i = trie.subtree_end[i];
      continue;
    }
    if (walk_states_.size() <= depth) walk_states_.resize(depth + 1);
    walk_states_[depth] = next;
    for (uint32_t k = trie.token_begin[i]; k < trie.token_begin[i + 1]; ++k) mask[static_cast<size_t>(trie.token_of[k])] = 1;
    ++i;
  }
  if (complete()) {
    for (Token t : vocabulary_->end_tokens()) mask[static_cast<size_t>(t)] = 1;
  }
  return mask;
}

}  // namespace strata::constrain
