// In-process communicator: collectives against sequential references, reuse under stress,
// mismatches and failures that must not hang, and tensor-parallel linear/QK-norm with the
// CPU backend equal to the single-rank result.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "dist/in_process.h"

using namespace moeserve;

namespace {

std::vector<float> rank_data(int rank, int64_t n, int round) {
  std::mt19937 rng(uint32_t(1000 * round + rank));
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor host_f32(const std::vector<float>& v, Shape s) {
  Tensor t = Tensor::host(DType::F32, std::move(s));
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}

}  // namespace

TEST(InProcessComm, AllReduceSumMatchesRankOrderSumOnEveryRank) {
  for (int world : {1, 2, 3, 4}) {
    InProcessGroup group(world);
    const int64_t n = 1037;
    std::vector<float> expect(static_cast<size_t>(n), 0.f);
    for (int r = 0; r < world; ++r) {
      auto d = rank_data(r, n, 0);
      for (int64_t i = 0; i < n; ++i) expect[size_t(i)] += d[size_t(i)];
    }
    std::vector<std::vector<float>> got(static_cast<size_t>(world));
    run_ranks(group, [&](Communicator& c) {
      EXPECT_EQ(c.world_size(), world);
      Tensor t = host_f32(rank_data(c.rank(), n, 0), {n});
      c.all_reduce_sum(t);
      got[size_t(c.rank())] = to_f32_vector(t);
    });
    for (int r = 0; r < world; ++r) EXPECT_EQ(got[size_t(r)], expect) << "world " << world << " rank " << r;
  }
}

TEST(InProcessComm, ManyBackToBackCollectivesStayConsistent) {
  // Different sizes every round, no barrier in between: catches a rank overwriting its
  // buffer (or slot) while a slower rank still reads the previous round.
  const int world = 4, rounds = 300;
  InProcessGroup group(world);
  std::atomic<int> failures{0};
  run_ranks(group, [&](Communicator& c) {
    for (int round = 0; round < rounds; ++round) {
      const int64_t n = 1 + (round * 37) % 200;
      Tensor t = host_f32(std::vector<float>(size_t(n), float(c.rank() + round)), {n});
      c.all_reduce_sum(t);
      const float expect = float(world * round + world * (world - 1) / 2);
      for (int64_t i = 0; i < n; ++i)
        if (t.ptr<float>()[i] != expect) ++failures;
      Tensor in = Tensor::host(DType::I32, {2}), out = Tensor::host(DType::I32, {world, 2});
      in.ptr<int32_t>()[0] = c.rank();
      in.ptr<int32_t>()[1] = round;
      c.all_gather(in, out);
      for (int r = 0; r < world; ++r)
        if (out.ptr<int32_t>()[2 * r] != r || out.ptr<int32_t>()[2 * r + 1] != round) ++failures;
    }
  });
  EXPECT_EQ(failures.load(), 0);
}

TEST(InProcessComm, BarrierOrdersPhases) {
  const int world = 3;
  InProcessGroup group(world);
  std::atomic<int> counter{0};
  std::atomic<int> bad{0};
  run_ranks(group, [&](Communicator& c) {
    for (int phase = 1; phase <= 50; ++phase) {
      ++counter;
      c.barrier();
      if (counter.load() != world * phase) ++bad;  // everyone incremented, nobody went ahead
      c.barrier();
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(InProcessComm, MismatchedShapesThrowOnEveryRank) {
  InProcessGroup group(2);
  std::atomic<int> threw{0};
  EXPECT_THROW(run_ranks(group,
                         [&](Communicator& c) {
                           Tensor t = Tensor::host(DType::F32, {c.rank() == 0 ? 4 : 5});
                           try {
                             c.all_reduce_sum(t);
                           } catch (const Error&) {
                             ++threw;
                             throw;
                           }
                         }),
               Error);
  EXPECT_EQ(threw.load(), 2);
}

TEST(InProcessComm, FailingRankAbortsTheOthersInsteadOfHanging) {
  InProcessGroup group(3);
  try {
    run_ranks(group, [&](Communicator& c) {
      if (c.rank() == 1) throw Error("rank 1 exploded");
      Tensor t = Tensor::host(DType::F32, {8});
      c.all_reduce_sum(t);  // would wait forever for rank 1 without abort
    });
    FAIL() << "expected an exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 exploded"), std::string::npos) << e.what();
  }
}

TEST(InProcessComm, RejectsBadArguments) {
  EXPECT_THROW(InProcessGroup(0), Error);
  InProcessGroup group(1);
  EXPECT_THROW(group.communicator(1), Error);
  auto c = group.communicator(0);
  Tensor i = Tensor::host(DType::I32, {3});
  EXPECT_THROW(c->all_reduce_sum(i), Error);
  Tensor out = Tensor::host(DType::I32, {4});
  EXPECT_THROW(c->all_gather(i, out), Error);
}

TEST(InProcessComm, TensorParallelLinearWithCpuBackend) {
  // Row-parallel (split input features, all-reduce) and column-parallel (split output
  // features, all-gather) linears on 2 ranks equal the single-rank linear.
  auto be = make_cpu_backend();
  const int world = 2;
  const int64_t T = 5, in = 96, out = 64;
  std::vector<float> x = rank_data(7, T * in, 1), w = rank_data(8, out * in, 1);
  Tensor xt = host_f32(x, {T, in}), ref = be->alloc(DType::F32, {T, out});
  LinearWeight lw;
  lw.weight = host_f32(w, {out, in});
  be->linear(xt, lw, ref);
  const auto ref_v = to_f32_vector(ref);

  InProcessGroup group(world);
  std::vector<std::vector<float>> row_par(world), col_par(world);
  run_ranks(group, [&](Communicator& c) {
    auto rbe = make_cpu_backend();
    const int r = c.rank();
    // Row-parallel: rank r has input features [r*in/2, (r+1)*in/2).
    std::vector<float> xs, ws;
    for (int64_t t = 0; t < T; ++t) xs.insert(xs.end(), x.begin() + t * in + r * in / 2, x.begin() + t * in + (r + 1) * in / 2);
    for (int64_t o = 0; o < out; ++o) ws.insert(ws.end(), w.begin() + o * in + r * in / 2, w.begin() + o * in + (r + 1) * in / 2);
    LinearWeight part;
    part.weight = host_f32(ws, {out, in / 2});
    Tensor y = rbe->alloc(DType::F32, {T, out});
    rbe->linear(host_f32(xs, {T, in / 2}), part, y);
    c.all_reduce_sum(y);
    row_par[size_t(r)] = to_f32_vector(y);
    // Column-parallel: rank r has output features [r*out/2, (r+1)*out/2); the gather is
    // rank-major [world, T, out/2].
    LinearWeight cols;
    cols.weight = lw.weight.slice_rows(r * out / 2, (r + 1) * out / 2);
    Tensor yc = rbe->alloc(DType::F32, {T, out / 2}), g = rbe->alloc(DType::F32, {world, T, out / 2});
    rbe->linear(xt, cols, yc);
    c.all_gather(yc, g);
    std::vector<float> full(static_cast<size_t>(T * out));
    for (int rr = 0; rr < world; ++rr)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < out / 2; ++j)
          full[size_t(t * out + rr * out / 2 + j)] = g.ptr<float>()[(rr * T + t) * (out / 2) + j];
    col_par[size_t(r)] = full;
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(col_par[size_t(r)], ref_v);  // same dot products: exact
    ASSERT_EQ(row_par[size_t(r)].size(), ref_v.size());
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < ref_v.size(); ++i) {
      max_diff = std::max(max_diff, double(std::fabs(row_par[size_t(r)][i] - ref_v[i])));
      max_ref = std::max(max_ref, double(std::fabs(ref_v[i])));
    }
    std::printf("  [max rel err] TP2 row-parallel linear rank %d: %.3e\n", r, max_diff / max_ref);
    EXPECT_LT(max_diff / max_ref, 1e-6);
  }
  EXPECT_EQ(row_par[0], row_par[1]);  // identical on both ranks
}

// ---- The collectives added for issue 7: each against a sequential reference. ----

TEST(InProcessComm, AllReduceBf16SumsInF32AndRoundsOnce) {
  const int world = 3;
  const int64_t n = 257;
  InProcessGroup group(world);
  std::vector<float> expect(size_t(n), 0.f);
  for (int r = 0; r < world; ++r) {
    auto d = rank_data(r, n, 5);
    for (int64_t i = 0; i < n; ++i) expect[size_t(i)] += bf16_to_f32(f32_to_bf16(d[size_t(i)]));
  }
  std::vector<std::vector<uint16_t>> got(world);
  run_ranks(group, [&](Communicator& c) {
    auto d = rank_data(c.rank(), n, 5);
    Tensor t = Tensor::host(DType::BF16, {n});
    for (int64_t i = 0; i < n; ++i) t.ptr<uint16_t>()[i] = f32_to_bf16(d[size_t(i)]);
    c.all_reduce_sum(t);
    got[size_t(c.rank())].assign(t.ptr<uint16_t>(), t.ptr<uint16_t>() + n);
  });
  for (int r = 0; r < world; ++r)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[size_t(r)][size_t(i)], f32_to_bf16(expect[size_t(i)])) << r << " " << i;
}

TEST(InProcessComm, ReduceScatterEqualsAllReduceBlock) {
  for (int world : {1, 2, 4}) {
    const int64_t n = 33;  // per-rank block
    InProcessGroup group(world);
    std::vector<float> full(size_t(world * n), 0.f);
    for (int r = 0; r < world; ++r) {
      auto d = rank_data(r, world * n, 6);
      for (size_t i = 0; i < full.size(); ++i) full[i] += d[i];
    }
    std::vector<std::vector<float>> got(world);
    run_ranks(group, [&](Communicator& c) {
      Tensor in = host_f32(rank_data(c.rank(), world * n, 6), {world, n});
      Tensor out = Tensor::host(DType::F32, {n});
      c.reduce_scatter_sum(in, out);
      got[size_t(c.rank())] = to_f32_vector(out);
      // In place: out aliases block `rank` of in.
      Tensor in2 = host_f32(rank_data(c.rank(), world * n, 6), {world, n});
      Tensor alias = in2.slice_rows(c.rank(), c.rank() + 1).reshaped({n});
      c.reduce_scatter_sum(in2, alias);
      EXPECT_EQ(to_f32_vector(alias), got[size_t(c.rank())]);
    });
    for (int r = 0; r < world; ++r)
      EXPECT_EQ(got[size_t(r)], std::vector<float>(full.begin() + r * n, full.begin() + (r + 1) * n)) << world;
  }
}

TEST(InProcessComm, AllToAllTransposesBlocks) {
  const int world = 4;
  const int64_t n = 5;
  InProcessGroup group(world);
  std::atomic<int> bad{0};
  run_ranks(group, [&](Communicator& c) {
    // Element k of block j on rank i = 1000 i + 100 j + k.
    Tensor in = Tensor::host(DType::I32, {world, n}), out = Tensor::host(DType::I32, {world, n});
    for (int j = 0; j < world; ++j)
      for (int k = 0; k < n; ++k) in.ptr<int32_t>()[j * n + k] = 1000 * c.rank() + 100 * j + k;
    c.all_to_all(in, out);
    for (int j = 0; j < world; ++j)
      for (int k = 0; k < n; ++k)
        if (out.ptr<int32_t>()[j * n + k] != 1000 * j + 100 * c.rank() + k) ++bad;
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(InProcessComm, AllToAllvRoutesVariableBlocks) {
  // Rank i sends (i + j) % 3 elements to rank j, each = 1000 i + 100 j + k (zero-sized
  // blocks included): an expert-parallel dispatch of tokens to their experts' ranks.
  const int world = 4;
  auto count = [](int i, int j) { return int64_t((i + j) % 3); };
  InProcessGroup group(world);
  std::atomic<int> bad{0};
  run_ranks(group, [&](Communicator& c) {
    const int i = c.rank();
    std::vector<int64_t> send(world), recv(world);
    std::vector<int32_t> data;
    for (int j = 0; j < world; ++j) {
      send[size_t(j)] = count(i, j);
      recv[size_t(j)] = count(j, i);
      for (int k = 0; k < count(i, j); ++k) data.push_back(1000 * i + 100 * j + k);
    }
    Tensor in = Tensor::host(DType::I32, {int64_t(data.size()) + 3});  // larger than needed
    std::copy(data.begin(), data.end(), in.ptr<int32_t>());
    Tensor out = Tensor::host(DType::I32, {16});
    c.all_to_allv(in, send, out, recv);
    int64_t p = 0;
    for (int j = 0; j < world; ++j)
      for (int k = 0; k < count(j, i); ++k)
        if (out.ptr<int32_t>()[p++] != 1000 * j + 100 * i + k) ++bad;
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(InProcessComm, BroadcastCopiesRoot) {
  const int world = 3;
  InProcessGroup group(world);
  std::atomic<int> bad{0};
  run_ranks(group, [&](Communicator& c) {
    for (int root = 0; root < world; ++root) {
      Tensor t = Tensor::host(DType::I32, {7});
      for (int k = 0; k < 7; ++k) t.ptr<int32_t>()[k] = 10 * c.rank() + k;
      c.broadcast(t, root);
      for (int k = 0; k < 7; ++k)
        if (t.ptr<int32_t>()[k] != 10 * root + k) ++bad;
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

// Every kind of cross-rank mismatch throws on every rank (none hangs).
TEST(InProcessComm, EveryMismatchThrowsOnEveryRank) {
  using Fn = std::function<void(Communicator&)>;
  const std::vector<std::pair<const char*, Fn>> cases = {
      {"all_gather numel",
       [](Communicator& c) {
         Tensor in = Tensor::host(DType::F32, {c.rank() + 1}), out = Tensor::host(DType::F32, {2 * (c.rank() + 1)});
         c.all_gather(in, out);
       }},
      {"reduce_scatter dtype",
       [](Communicator& c) {
         DType dt = c.rank() ? DType::BF16 : DType::F32;
         Tensor in = Tensor::host(dt, {4}), out = Tensor::host(dt, {2});
         c.reduce_scatter_sum(in, out);
       }},
      {"all_to_all numel",
       [](Communicator& c) {
         Tensor t = Tensor::host(DType::F32, {2 * (c.rank() + 1)}), u = Tensor::host(DType::F32, t.shape);
         c.all_to_all(t, u);
       }},
      {"all_to_allv counts",
       [](Communicator& c) {
         std::vector<int64_t> send{1, 1}, recv{1, c.rank() == 0 ? 2 : 1};
         Tensor in = Tensor::host(DType::F32, {2}), out = Tensor::host(DType::F32, {3});
         c.all_to_allv(in, send, out, recv);
       }},
      {"broadcast root",
       [](Communicator& c) {
         Tensor t = Tensor::host(DType::F32, {3});
         c.broadcast(t, c.rank());
       }},
      {"different collectives",
       [](Communicator& c) {
         Tensor t = Tensor::host(DType::F32, {4}), out = Tensor::host(DType::F32, {8});
         if (c.rank() == 0) c.all_reduce_sum(t);
         else c.all_gather(t, out);
       }},
  };
  for (const auto& [name, fn] : cases) {
    InProcessGroup group(2);
    std::atomic<int> threw{0};
    EXPECT_THROW(run_ranks(group,
                           [&](Communicator& c) {
                             try {
                               fn(c);
                             } catch (const Error&) {
                               ++threw;
                               throw;
                             }
                           }),
                 Error)
        << name;
    EXPECT_EQ(threw.load(), 2) << name;
  }
}

TEST(InProcessComm, LocalArgumentErrorsThrowBeforeExchanging) {
  InProcessGroup group(2);
  auto c = group.communicator(0);
  Tensor f4 = Tensor::host(DType::F32, {4}), f3 = Tensor::host(DType::F32, {3}), i4 = Tensor::host(DType::I32, {4});
  EXPECT_THROW(c->reduce_scatter_sum(f4, f3), Error);  // 4 != 2 * 3
  EXPECT_THROW(c->reduce_scatter_sum(i4, i4), Error);  // integer sum unsupported
  EXPECT_THROW(c->all_to_all(f3, f3), Error);          // 3 does not split into 2 blocks
  EXPECT_THROW(c->all_to_allv(f4, {1}, f4, {1, 1}), Error);
  EXPECT_THROW(c->all_to_allv(f4, {3, 3}, f4, {1, 1}), Error);  // sends more than `in` holds
  EXPECT_THROW(c->all_to_allv(f4, {-1, 1}, f4, {1, 1}), Error);
  EXPECT_THROW(c->broadcast(f4, 2), Error);
}
