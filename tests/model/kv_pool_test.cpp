// The KV pool's block accounting and prefix index: eviction order, pinning, sharing, and
// hash collisions settled by comparing token ids and parents.
#include <gtest/gtest.h>

#include <numeric>

#include "model/kv_pool.h"

namespace strata::model {
namespace {

Config tiny_config() {
  Config c;
  c.kv_head_count = 2;
  c.head_dim = 4;
  return c;
}

KvPool make_pool(int blocks, KvPool::Hasher hasher = chain_hash) {
  return KvPool(KvLayout(tiny_config(), 1, KvType::F32), blocks, hasher);
}

// `count` blocks of ids, block b's ids starting at `first + b * kKvBlock`.
std::vector<Token> ids(int count, int first = 0) {
  std::vector<Token> out(static_cast<size_t>(count) * kKvBlock);
  std::iota(out.begin(), out.end(), first);
  return out;
}

std::span<const Token> block_ids(const std::vector<Token>& tokens, int b) {
  return std::span<const Token>(tokens).subspan(static_cast<size_t>(b) * kKvBlock, kKvBlock);
}

// Computes `tokens` into fresh blocks and publishes them as one sequence would; returns the blocks (pinned).
std::vector<int> publish_chain(KvPool& pool, const std::vector<Token>& tokens) {
  std::vector<int> blocks;
  KvPool::Link parent;
  for (int b = 0; b < static_cast<int>(tokens.size()) / kKvBlock; ++b) {
    const int block = *pool.allocate();
    blocks.push_back(block);
    const auto link = pool.publish(block, parent, block_ids(tokens, b));
    EXPECT_TRUE(link);
    parent = *link;
  }
  return blocks;
}

void unpin_all(KvPool& pool, const std::vector<int>& blocks) {
  for (int b : blocks) pool.unpin(b);
}

TEST(KvLayoutTest, KeysAndValuesOfEveryLayerAndHeadTile) {
  const KvLayout layout(tiny_config(), 3, KvType::F16);
  EXPECT_EQ(layout.key_elements, 4u * kKvBlock);
  EXPECT_EQ(layout.value_elements, 4u * kKvBlock);
  EXPECT_EQ(layout.block_bytes, 3u * 2 * 2 * 4 * kKvBlock * 2);
  EXPECT_EQ(layout.key_offset(0, 1), layout.key_elements * 2);
  EXPECT_EQ(layout.value_offset(0, 0), 2 * layout.key_elements * 2);
  EXPECT_EQ(layout.value_offset(2, 1) + layout.value_elements * 2, layout.block_bytes);
}

// Latent attention caches one KV head of keys alone (the latent and the rotated part), whose
// values are the keys' latent; layers of such keys tile the block.
TEST(KvLayoutTest, LatentAttentionKeysAloneTile) {
  Config c;
  c.kv_head_count = 1;
  c.head_dim = 6;
  c.mla.kv_rank = 4;
  const KvLayout layout(c, 2, KvType::F32);
  EXPECT_EQ(layout.key_elements, 6u * kKvBlock);
  EXPECT_EQ(layout.value_elements, 0u);
  EXPECT_EQ(layout.value_row_elements(), 0u);
  EXPECT_EQ(layout.key_offset(1, 0), 6u * kKvBlock * 4);
  EXPECT_EQ(layout.key_offset(1, 0) + layout.key_elements * 4, layout.block_bytes);
  EXPECT_EQ(layout.block_bytes, 2u * 6 * kKvBlock * 4);
}

TEST(KvPoolTest, AllocatesUntilEveryBlockIsPinned) {
  KvPool pool = make_pool(3);
  std::vector<int> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(*pool.allocate());
  EXPECT_FALSE(pool.allocate());
  EXPECT_EQ(pool.stats().pinned_blocks, 3);
  pool.unpin(blocks[1]);  // never published: free again
  EXPECT_EQ(pool.stats().used_blocks, 2);
  EXPECT_EQ(pool.allocate(), blocks[1]);
  EXPECT_EQ(pool.stats().evictions, 0u);
}

TEST(KvPoolTest, FindsTheLongestIndexedPrefix) {
  KvPool pool = make_pool(8);
  const std::vector<Token> tokens = ids(3);
  unpin_all(pool, publish_chain(pool, tokens));
  EXPECT_EQ(pool.stats().used_blocks, 3);  // cached, not freed

  std::vector<int> blocks;
  std::vector<KvPool::Link> links;
  std::vector<Token> longer = tokens;
  longer.insert(longer.end(), 10, 7);  // a partial block after them is never matched
  EXPECT_EQ(pool.match(longer, blocks, links), 3);
  EXPECT_EQ(links.size(), 3u);
  unpin_all(pool, blocks);

  blocks.clear();
  std::vector<Token> diverging = tokens;
  diverging[2 * kKvBlock + 5] = 999;  // the third block differs
  EXPECT_EQ(pool.match(diverging, blocks, links), 2);
  unpin_all(pool, blocks);

  blocks.clear();
  EXPECT_EQ(pool.match(std::span(tokens).first(kKvBlock), blocks, links), 1);  // what the caller asks
  unpin_all(pool, blocks);

  blocks.clear();
  std::vector<Token> first_differs = tokens;
  first_differs[0] = 999;
  EXPECT_EQ(pool.match(first_differs, blocks, links), 0);
  const KvPoolStats s = pool.stats();
  EXPECT_EQ(s.hits, 6u);
  EXPECT_EQ(s.misses, 4u);
  EXPECT_EQ(s.pinned_blocks, 0);
}

TEST(KvPoolTest, EvictsTheLeastRecentlyUsedCachedBlockFirst) {
  KvPool pool = make_pool(3);
  const std::vector<Token> a = ids(1, 0), b = ids(1, 100), c = ids(1, 200);
  unpin_all(pool, publish_chain(pool, a));
  unpin_all(pool, publish_chain(pool, b));
  unpin_all(pool, publish_chain(pool, c));
  // Using a makes b the oldest.
  std::vector<int> blocks;
  std::vector<KvPool::Link> links;
  ASSERT_EQ(pool.match(a, blocks, links), 1);
  unpin_all(pool, blocks);

  ASSERT_TRUE(pool.allocate());
  EXPECT_EQ(pool.stats().evictions, 1u);
  blocks.clear();
  EXPECT_EQ(pool.match(b, blocks, links), 0);
  EXPECT_EQ(pool.match(a, blocks, links), 1);
  EXPECT_EQ(pool.match(c, blocks, links), 1);
}

TEST(KvPoolTest, PinnedBlocksAreNeverEvictedAndMaySeveralSequencesShareThem) {
  KvPool pool = make_pool(2);
  const std::vector<Token> prefix = ids(1);
  const std::vector<int> computed = publish_chain(pool, prefix);  // still pinned by its sequence
  std::vector<int> first, second;
  std::vector<KvPool::Link> links;
  ASSERT_EQ(pool.match(prefix, first, links), 1);
  ASSERT_EQ(pool.match(prefix, second, links), 1);
  EXPECT_EQ(first, computed);
  EXPECT_EQ(second, computed);
  EXPECT_EQ(pool.stats().pinned_blocks, 1);

  const int other = *pool.allocate();
  EXPECT_FALSE(pool.allocate());  // the shared block stays, however full the pool
  unpin_all(pool, computed);
  unpin_all(pool, first);
  EXPECT_FALSE(pool.allocate());
  unpin_all(pool, second);
  EXPECT_EQ(pool.allocate(), computed[0]);  // now only cached: evicted for new work
  pool.unpin(other);
}

TEST(KvPoolTest, ADuplicateBlockStaysPrivateAndTheChainGoesOnThroughTheIndexedOne) {
  KvPool pool = make_pool(4);
  const std::vector<Token> tokens = ids(2);
  const std::vector<int> first = publish_chain(pool, tokens);
  // A second sequence that computed the same blocks itself.
  const int mine = *pool.allocate();
  const auto link = pool.publish(mine, {}, block_ids(tokens, 0));
  ASSERT_TRUE(link);
  pool.unpin(mine);  // private: freed, not cached
  EXPECT_EQ(pool.stats().used_blocks, 2);
  unpin_all(pool, first);
  std::vector<int> blocks;
  std::vector<KvPool::Link> links;
  EXPECT_EQ(pool.match(tokens, blocks, links), 2);
  EXPECT_EQ(links[0].serial, link->serial);
}

uint64_t constant_hash(uint64_t, std::span<const Token>) { return 42; }
uint64_t ids_only_hash(uint64_t, std::span<const Token> ids) { return chain_hash(0, ids); }

TEST(KvPoolTest, AHashCollisionIsAMissNotAWrongMatch) {
  KvPool pool = make_pool(4, constant_hash);
  const std::vector<Token> a = ids(1, 0), b = ids(1, 500);
  unpin_all(pool, publish_chain(pool, a));
  std::vector<int> blocks;
  std::vector<KvPool::Link> links;
  EXPECT_EQ(pool.match(b, blocks, links), 0);
  // b cannot enter the index under a's hash: its sequence publishes nothing more.
  const int block = *pool.allocate();
  EXPECT_FALSE(pool.publish(block, {}, block_ids(b, 0)));
  pool.unpin(block);
  EXPECT_EQ(pool.match(a, blocks, links), 1);
}

TEST(KvPoolTest, TheSameIdsAfterAnotherPrefixDoNotMatch) {
  // A hash that forgets the parent: only the parent's serial tells the chains apart.
  KvPool pool = make_pool(6, ids_only_hash);
  std::vector<Token> first = ids(2, 0);
  unpin_all(pool, publish_chain(pool, first));
  std::vector<Token> other = ids(1, 1000);
  other.insert(other.end(), first.begin() + kKvBlock, first.end());  // same second block
  std::vector<int> blocks;
  std::vector<KvPool::Link> links;
  EXPECT_EQ(pool.match(other, blocks, links), 0);
  EXPECT_EQ(pool.match(first, blocks, links), 2);
}

TEST(KvPoolTest, AnEvictedParentOrphansItsChildren) {
  KvPool pool = make_pool(3);
  const std::vector<Token> tokens = ids(2);
  std::vector<int> chain = publish_chain(pool, tokens);
  pool.unpin(chain[0]);  // the parent becomes the oldest cached block
  pool.unpin(chain[1]);
  const int a = *pool.allocate();  // the free one
  const int b = *pool.allocate();  // evicts the parent
  EXPECT_EQ(b, chain[0]);
  // The same parent computed again gets a new serial: the old child is not taken for it.
  ASSERT_TRUE(pool.publish(b, {}, block_ids(tokens, 0)));
  std::vector<int> blocks;
  std::vector<KvPool::Link> links;
  EXPECT_EQ(pool.match(tokens, blocks, links), 1);
  pool.unpin(a);
}

// A window pool keeps its blocks under the links of the full pool's chain, which verify the
// tokens before them: a block is found only after the same parent, with the same ids.
TEST(KvPoolTest, ABlockBesideAnotherChainIsFoundOnlyAfterItsParentWithItsIds) {
  KvPool full = make_pool(4);
  KvPool window = make_pool(4);
  const std::vector<Token> tokens = ids(2);
  const std::vector<int> chain = publish_chain(full, tokens);
  std::vector<int> blocks;
  std::vector<KvPool::Link> links;
  ASSERT_EQ(full.match(tokens, blocks, links), 2);
  const int beside = *window.allocate();
  window.publish_beside(beside, links[0], block_ids(tokens, 1));
  window.unpin(beside);
  EXPECT_EQ(window.find_beside(links[0], block_ids(tokens, 1)), beside);
  EXPECT_FALSE(window.find_beside({}, block_ids(tokens, 1))) << "after another parent";
  EXPECT_FALSE(window.find_beside(links[0], block_ids(tokens, 0))) << "other ids";
  EXPECT_FALSE(window.find_beside({links[0].hash, links[0].serial + 7}, block_ids(tokens, 1))) << "a parent since replaced";
  EXPECT_EQ(window.stats().pinned_blocks, 0) << "a lookup pins nothing";
  unpin_all(full, chain);
  unpin_all(full, blocks);
}

// An entry left by a chain the full pool has since let go (its parent computed again under a
// new serial) gives way to the new one at once, so the window pool does not wait for the LRU.
TEST(KvPoolTest, AnEntryOfAGoneChainGivesWayBesideTheNewOne) {
  KvPool window = make_pool(3);
  const std::vector<Token> tokens = ids(1);
  const KvPool::Link old_parent{42, 1};
  const KvPool::Link new_parent{42, 2};
  const int stale = *window.allocate();
  window.publish_beside(stale, old_parent, block_ids(tokens, 0));
  window.unpin(stale);
  const int fresh = *window.allocate();
  window.publish_beside(fresh, new_parent, block_ids(tokens, 0));
  EXPECT_EQ(window.find_beside(new_parent, block_ids(tokens, 0)), fresh);
  EXPECT_FALSE(window.find_beside(old_parent, block_ids(tokens, 0)));
  const KvPoolStats stats = window.stats();
  EXPECT_EQ(stats.used_blocks, 1) << "the stale block is free, not cached";
  const int again = *window.allocate();
  window.publish_beside(again, new_parent, block_ids(tokens, 0));
  EXPECT_EQ(window.find_beside(new_parent, block_ids(tokens, 0)), fresh) << "the same block again stays private";
  window.unpin(again);
  window.unpin(fresh);
}

}  // namespace
}  // namespace strata::model
