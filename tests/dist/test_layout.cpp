// ParallelLayout grid arithmetic and refusals (no MPI needed).
#include <gtest/gtest.h>

#include "dist/error.h"
#include "dist/parallel_layout.h"
#include "dist/tensor_parallel.h"

using ac::dist::GridShape;
using ac::dist::LayoutSpec;
using ac::dist::resolve_grid;

TEST(Layout, TpFastestMegatronOrder) {
  GridShape g = resolve_grid(8, LayoutSpec{2, 0, 0});
  EXPECT_EQ(g.tp, 2);
  EXPECT_EQ(g.dp, 4);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(g.tp_rank_of(r), r % 2);
    EXPECT_EQ(g.dp_rank_of(r), r / 2);
    EXPECT_EQ(g.rank(g.tp_rank_of(r), g.dp_rank_of(r)), r);
  }
  EXPECT_EQ(g.tp_groups(), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.dp_groups(), (std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}}));
}

TEST(Layout, ExplicitDp) {
  GridShape g = resolve_grid(4, LayoutSpec{4, 1, 32});
  EXPECT_EQ(g.tp, 4);
  EXPECT_EQ(g.dp, 1);
}

static std::string refusal(int world, LayoutSpec spec) {
  try {
    resolve_grid(world, spec);
  } catch (const ac::InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Layout, RefusesImpossibleLayouts) {
  EXPECT_NE(refusal(3, {2, 0, 0}).find("world size 3 is not divisible by the tensor-parallel size 2"),
            std::string::npos);
  EXPECT_NE(refusal(4, {2, 3, 0}).find("tp 2 x dp 3 = 6 ranks, but the world has 4"), std::string::npos);
  EXPECT_NE(refusal(8, {8, 0, 4}).find("larger than the 4 attention heads"), std::string::npos);
  EXPECT_NE(refusal(6, {6, 0, 32}).find("32 attention heads cannot be split evenly over 6"), std::string::npos);
  EXPECT_NE(refusal(2, {0, 0, 0}).find("tensor-parallel size must be >= 1"), std::string::npos);
  EXPECT_EQ(refusal(4, {2, 2, 32}), "");
}

// EP folded onto DP in Megatron's MoE order: dp_rank = ep_rank + EP x edp_rank.
TEST(Layout, ExpertParallelGroupsFoldedOntoDp) {
  GridShape g = resolve_grid(16, LayoutSpec{2, 0, 0, 4});
  EXPECT_EQ(g.dp, 8);
  EXPECT_EQ(g.ep, 4);
  EXPECT_EQ(g.edp(), 2);
  EXPECT_EQ(g.ep_rank_of(6), 3);   // tp 0, dp 3
  EXPECT_EQ(g.edp_rank_of(10), 1); // tp 0, dp 5
  EXPECT_EQ(g.ep_groups(), (std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(g.edp_groups(), (std::vector<std::vector<int>>{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  // TP x EP groups in the order of the whole experts' owners: TP rank x EP + EP rank.
  EXPECT_EQ(g.tp_ep_groups(), (std::vector<std::vector<int>>{{0, 2, 4, 6, 1, 3, 5, 7}, {8, 10, 12, 14, 9, 11, 13, 15}}));
  for (const auto& grp : g.tp_ep_groups())
    for (size_t i = 0; i < grp.size(); ++i) EXPECT_EQ(g.tp_ep_rank_of(grp[i]), int(i)) << grp[i];
  EXPECT_NE(refusal(8, {2, 0, 0, 3}).find("ep: expert-parallel size 3 does not divide the data-parallel size 4"),
            std::string::npos);
  EXPECT_NE(refusal(4, {1, 0, 0, 0}).find("expert-parallel size must be >= 1"), std::string::npos);
  EXPECT_EQ(refusal(4, {1, 0, 0, 4}), "");
}

TEST(Layout, ShardRanges) {
  auto r = ac::dist::shard_range(12, 4, 3);
  EXPECT_EQ(r.start, 9);
  EXPECT_EQ(r.size, 3);
  EXPECT_THROW(ac::dist::shard_range(10, 4, 0), ac::InputError);
  // Padded vocabulary shards: 37 ids over 4 ranks -> shards of 10, the last has 7 valid rows.
  auto v = ac::dist::vocab_shard(37, 4, 3);
  EXPECT_EQ(v.shard, 10);
  EXPECT_EQ(v.start, 30);
  EXPECT_EQ(v.valid, 7);
  EXPECT_EQ(ac::dist::vocab_shard(37, 4, 0).valid, 10);
}
