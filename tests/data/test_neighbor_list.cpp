// The radius graph against brute force: every pair of atoms at every periodic image within
// range, on random periodic (cubic and triclinic, a cutoff larger than half the box and than the
// whole box), mixed and non-periodic structures; max_neighbors, self loops, the edge order, the
// batch transform's layout, and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "../error_message.h"
#include "mpigrad/data/neighbor_list.h"

using namespace mpigrad;  // NOLINT
using core::Tensor;
using mpigrad::test::error_message;

namespace {

using Cell = std::array<double, 9>;

struct Edge {
  int64_t target, source;
  std::array<int64_t, 3> image;
  double distance;
  auto key() const { return std::tie(target, source, image); }
};

// Atoms at fractional coordinates in [-0.5, 1.5) of `cell` (so some lie outside it, which the
// search must wrap), or Cartesian in [0, 6) when the cell is not used.
std::vector<double> random_positions(int64_t atoms, const Cell& cell, bool in_cell,
                                     std::mt19937_64& rng) {
  std::uniform_real_distribution<double> fraction(-0.5, 1.5), box(0.0, 6.0);
  std::vector<double> positions;
  for (int64_t a = 0; a < atoms; ++a) {
    if (!in_cell) {
      for (int c = 0; c < 3; ++c) positions.push_back(box(rng));
      continue;
    }
    const double s[3] = {fraction(rng), fraction(rng), fraction(rng)};
    for (int c = 0; c < 3; ++c) {
      positions.push_back(s[0] * cell[size_t(c)] + s[1] * cell[size_t(3 + c)] +
                          s[2] * cell[size_t(6 + c)]);
    }
  }
  return positions;
}

// Every (target, source, image) closer than the cutoff, the images searched far enough out.
std::vector<Edge> brute_force(const std::vector<double>& positions, const Cell& cell,
                              const std::array<bool, 3>& pbc, double cutoff, bool self_loops) {
  const int64_t atoms = int64_t(positions.size() / 3);
  std::array<int64_t, 3> range{};
  for (int k = 0; k < 3; ++k) {
    const double length = std::sqrt(cell[size_t(3 * k)] * cell[size_t(3 * k)] +
                                    cell[size_t(3 * k + 1)] * cell[size_t(3 * k + 1)] +
                                    cell[size_t(3 * k + 2)] * cell[size_t(3 * k + 2)]);
    // Generous: positions lie up to two cells apart, and a skewed cell is thinner than long.
    range[size_t(k)] = pbc[size_t(k)] ? int64_t(std::ceil(3.0 * cutoff / length)) + 4 : 0;
  }
  std::vector<Edge> edges;
  for (int64_t t = 0; t < atoms; ++t) {
    for (int64_t s = 0; s < atoms; ++s) {
      for (int64_t n0 = -range[0]; n0 <= range[0]; ++n0) {
        for (int64_t n1 = -range[1]; n1 <= range[1]; ++n1) {
          for (int64_t n2 = -range[2]; n2 <= range[2]; ++n2) {
            if (s == t && n0 == 0 && n1 == 0 && n2 == 0 && !self_loops) continue;
            double d2 = 0;
            for (int c = 0; c < 3; ++c) {
              const double shift = double(n0) * cell[size_t(c)] + double(n1) * cell[size_t(3 + c)] +
                                   double(n2) * cell[size_t(6 + c)];
              const double v = positions[size_t(3 * t + c)] - positions[size_t(3 * s + c)] + shift;
              d2 += v * v;
            }
            if (d2 < cutoff * cutoff) edges.push_back({t, s, {n0, n1, n2}, std::sqrt(d2)});
          }
        }
      }
    }
  }
  std::sort(edges.begin(), edges.end(),
            [](const Edge& a, const Edge& b) { return a.key() < b.key(); });
  return edges;
}

std::vector<Edge> edges_of(const data::StructureEdges& found, const std::vector<double>& positions,
                           const Cell& cell) {
  std::vector<Edge> edges;
  for (int64_t e = 0; e < found.size(); ++e) {
    Edge edge{found.target[size_t(e)],
              found.source[size_t(e)],
              {found.image[size_t(3 * e)], found.image[size_t(3 * e + 1)],
               found.image[size_t(3 * e + 2)]},
              0};
    double d2 = 0;
    for (int c = 0; c < 3; ++c) {
      const double expected_shift = double(edge.image[0]) * cell[size_t(c)] +
                                    double(edge.image[1]) * cell[size_t(3 + c)] +
                                    double(edge.image[2]) * cell[size_t(6 + c)];
      CHECK(found.shift[size_t(3 * e + c)] == doctest::Approx(expected_shift).epsilon(1e-12));
      const double v = positions[size_t(3 * edge.target + c)] -
                       positions[size_t(3 * edge.source + c)] + found.shift[size_t(3 * e + c)];
      d2 += v * v;
    }
    edge.distance = std::sqrt(d2);
    edges.push_back(edge);
  }
  return edges;
}

// The search gives exactly brute force's edges, in brute force's (the contract's) order.
void check_against_brute_force(const std::vector<double>& positions, const Cell& cell,
                               const std::array<bool, 3>& pbc, double cutoff,
                               bool self_loops = false) {
  const data::StructureEdges found =
      data::radius_graph(positions, cell, pbc, {.cutoff = cutoff, .self_loops = self_loops});
  const std::vector<Edge> expected = brute_force(positions, cell, pbc, cutoff, self_loops);
  const std::vector<Edge> got =
      edges_of(found, positions, pbc[0] || pbc[1] || pbc[2] ? cell : Cell{});
  REQUIRE(got.size() == expected.size());
  for (size_t e = 0; e < got.size(); ++e) {
    CHECK(got[e].key() == expected[e].key());
    CHECK(got[e].distance == doctest::Approx(expected[e].distance).epsilon(1e-9));
  }
}

const Cell kCubic = {5, 0, 0, 0, 5, 0, 0, 0, 5};
// Strongly skewed: the faces are much closer together than the vectors are long.
const Cell kTriclinic = {4.0, 0.0, 0.0, 2.9, 3.6, 0.0, -1.7, 1.3, 3.9};

}  // namespace

TEST_CASE("radius_graph: periodic cubic and triclinic cells against brute force") {
  std::mt19937_64 rng(7);
  for (const Cell& cell : {kCubic, kTriclinic}) {
    for (double cutoff : {1.5, 2.2, 3.1}) {  // 3.1 passes half the box (and the skewed heights)
      CAPTURE(cutoff);
      check_against_brute_force(random_positions(24, cell, true, rng), cell, {true, true, true},
                                cutoff);
    }
  }
}

TEST_CASE("radius_graph: a cutoff longer than the whole cell sees several images of each atom") {
  std::mt19937_64 rng(11);
  const Cell small = {2.0, 0.0, 0.0, 0.5, 1.8, 0.0, 0.3, -0.4, 2.2};
  const std::vector<double> positions = random_positions(5, small, true, rng);
  check_against_brute_force(positions, small, {true, true, true}, 4.5);
  // An atom alone in a cell: only its own images.
  const std::vector<double> one = {0.3, 0.2, 0.1};
  const data::StructureEdges edges =
      data::radius_graph(one, kCubic, {true, true, true}, {.cutoff = 5.5});
  CHECK(edges.size() == 6);  // the six face neighbors at 5; the next images are 7.07 away
}

TEST_CASE("radius_graph: mixed and no periodicity against brute force") {
  std::mt19937_64 rng(3);
  check_against_brute_force(random_positions(30, kTriclinic, true, rng), kTriclinic,
                            {true, false, true}, 2.4);
  check_against_brute_force(random_positions(30, kCubic, true, rng), kCubic, {false, false, true},
                            3.0);
  // No pbc: the cell plays no part, even a zero one; a cluster larger than many cutoffs.
  const std::vector<double> cluster = random_positions(60, Cell{}, false, rng);
  check_against_brute_force(cluster, Cell{}, {false, false, false}, 1.7);
  check_against_brute_force(cluster, kTriclinic, {false, false, false}, 2.5);
}

TEST_CASE("radius_graph: self loops, and the nearest max_neighbors of each target") {
  std::mt19937_64 rng(5);
  const std::vector<double> positions = random_positions(20, kCubic, true, rng);
  check_against_brute_force(positions, kCubic, {true, true, true}, 2.5, /*self_loops=*/true);
  const data::StructureEdges loops = data::radius_graph(positions, kCubic, {true, true, true},
                                                        {.cutoff = 2.5, .self_loops = true});
  int64_t self = 0;
  for (int64_t e = 0; e < loops.size(); ++e) {
    const bool origin = loops.image[size_t(3 * e)] == 0 && loops.image[size_t(3 * e + 1)] == 0 &&
                        loops.image[size_t(3 * e + 2)] == 0;
    self += loops.source[size_t(e)] == loops.target[size_t(e)] && origin ? 1 : 0;
  }
  CHECK(self == 20);

  const double cutoff = 3.5;
  const int64_t keep = 4;
  const std::vector<Edge> all = brute_force(positions, kCubic, {true, true, true}, cutoff, false);
  const data::StructureEdges limited = data::radius_graph(
      positions, kCubic, {true, true, true}, {.cutoff = cutoff, .max_neighbors = keep});
  const std::vector<Edge> kept = edges_of(limited, positions, kCubic);
  for (int64_t target = 0; target < 20; ++target) {
    std::vector<double> every, mine;
    for (const Edge& edge : all)
      if (edge.target == target) every.push_back(edge.distance);
    for (const Edge& edge : kept)
      if (edge.target == target) mine.push_back(edge.distance);
    std::sort(every.begin(), every.end());
    std::sort(mine.begin(), mine.end());
    REQUIRE(int64_t(mine.size()) == std::min<int64_t>(keep, int64_t(every.size())));
    for (size_t i = 0; i < mine.size(); ++i) CHECK(mine[i] == doctest::Approx(every[i]));
  }
  // Still in the contract's order, each edge one brute force also has.
  CHECK(std::is_sorted(kept.begin(), kept.end(),
                       [](const Edge& a, const Edge& b) { return a.key() < b.key(); }));
  for (const Edge& edge : kept) {
    CHECK(
        std::any_of(all.begin(), all.end(), [&](const Edge& e) { return e.key() == edge.key(); }));
  }
}

TEST_CASE("radius_graph_transform: a ragged batch gets batch rows, shifts and edges_ptr") {
  std::mt19937_64 rng(13);
  const std::vector<int64_t> counts = {7, 1, 12};
  const std::vector<Cell> cells = {kTriclinic, kCubic, Cell{}};
  const std::vector<std::array<bool, 3>> pbcs = {
      {true, true, true}, {true, true, true}, {false, false, false}};
  std::vector<std::vector<double>> structures;
  std::vector<float> positions, cell_values;
  std::vector<uint8_t> pbc_values;
  std::vector<int64_t> atoms_ptr = {0};
  for (size_t b = 0; b < counts.size(); ++b) {
    std::vector<double> p = random_positions(counts[b], cells[b], b != 2, rng);
    for (double& x : p) x = double(float(x));  // what the batch holds
    for (double x : p) positions.push_back(float(x));
    structures.push_back(p);
    for (double v : cells[b]) cell_values.push_back(float(v));
    for (bool v : pbcs[b]) pbc_values.push_back(v ? 1 : 0);
    atoms_ptr.push_back(atoms_ptr.back() + counts[b]);
  }
  data::Batch batch;
  batch.indices = {40, 41, 42};
  const int64_t atoms = atoms_ptr.back();
  batch.set("positions", Tensor::from_vector<float>(positions, {atoms, 3}));
  batch.set("atoms_ptr", Tensor::from_vector<int64_t>(atoms_ptr, {4}));
  batch.set("cell", Tensor::from_vector<float>(cell_values, {3, 3, 3}));
  batch.set("pbc", Tensor::from_vector<uint8_t>(pbc_values, {3, 3}).to(core::kBool));
  // A store's stale list is replaced.
  batch.set("edge_index", Tensor::from_vector<int64_t>({0, 1}, {2, 1}));
  const double cutoff = 2.6;
  batch = data::radius_graph_transform({.cutoff = cutoff})(std::move(batch));

  const Tensor edge_index = batch["edge_index"];
  const std::vector<int64_t> edges_ptr = batch["edges_ptr"].to_vector<int64_t>();
  REQUIRE(edges_ptr.size() == 4);
  const int64_t total = edges_ptr.back();
  CHECK(edge_index.shape() == core::Shape{2, total});
  CHECK(batch["edge_shifts"].shape() == core::Shape{total, 3});
  const std::vector<int64_t> rows = edge_index.to_vector<int64_t>();
  const std::vector<float> shifts = batch["edge_shifts"].to_vector<float>();
  for (size_t b = 0; b < counts.size(); ++b) {
    CAPTURE(b);
    std::vector<double> cell(cells[b].begin(), cells[b].end());
    for (double& v : cell) v = double(float(v));
    Cell rounded{};
    std::copy(cell.begin(), cell.end(), rounded.begin());
    const std::vector<Edge> expected = brute_force(structures[b], rounded, pbcs[b], cutoff, false);
    REQUIRE(edges_ptr[b + 1] - edges_ptr[b] == int64_t(expected.size()));
    for (int64_t e = edges_ptr[b]; e < edges_ptr[b + 1]; ++e) {
      const Edge& want = expected[size_t(e - edges_ptr[b])];
      CHECK(rows[size_t(e)] == atoms_ptr[b] + want.source);          // row 0: sources
      CHECK(rows[size_t(total + e)] == atoms_ptr[b] + want.target);  // row 1: targets
      double d2 = 0;
      for (int c = 0; c < 3; ++c) {
        const double v = double(positions[size_t(3 * rows[size_t(total + e)] + c)]) -
                         double(positions[size_t(3 * rows[size_t(e)] + c)]) +
                         double(shifts[size_t(3 * e + c)]);
        d2 += v * v;
      }
      CHECK(std::sqrt(d2) == doctest::Approx(want.distance).epsilon(1e-5));
    }
  }
  // Without cell and pbc fields every structure is a cluster.
  data::Batch plain;
  plain.indices = {0};
  plain.set("positions", Tensor::from_vector<float>({0, 0, 0, 1, 0, 0, 5, 0, 0}, {3, 3}));
  plain.set("atoms_ptr", Tensor::from_vector<int64_t>({0, 3}, {2}));
  plain = data::radius_graph_transform({.cutoff = 2.0})(std::move(plain));
  CHECK(plain["edge_index"].to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 1});
  CHECK(plain["edge_shifts"].to_vector<float>() == std::vector<float>(6, 0.0f));
  CHECK(plain["edges_ptr"].to_vector<int64_t>() == std::vector<int64_t>{0, 2});
}

TEST_CASE("radius_graph: bad input is one error naming the structure") {
  const std::vector<double> two = {0, 0, 0, 1, 1, 1};
  const Cell flat = {3, 0, 0, 0, 3, 0, 0, 0, 0};
  CHECK(error_message([&] {
          data::radius_graph(two, flat, {true, true, false}, {.cutoff = 2.0}, "structure 9");
        })
            .starts_with("structure 9: pbc is set on an axis but the cell [3 0 0; 0 3 0; 0 0 0] "
                         "has no volume"));
  CHECK(error_message([&] {
          data::radius_graph(two, kCubic, {true, true, true}, {.cutoff = 0.0}, "here");
        }) == "here: the cutoff must be positive, got 0");
  const std::vector<double> bad = {0, 0, 0, 1, std::nan(""), 1};
  CHECK(error_message([&] {
          data::radius_graph(bad, kCubic, {true, true, true}, {.cutoff = 2.0}, "here");
        }) == "here: atom 1 has position component nan");
  const Cell tiny = {1e-3, 0, 0, 0, 1e-3, 0, 0, 0, 1e-3};
  CHECK(error_message([&] {
          data::radius_graph(two, tiny, {true, true, true}, {.cutoff = 5.0}, "here");
        }).find("is the cell in the same units as the positions?") != std::string::npos);
  data::Batch batch;
  batch.indices = {17};
  batch.set("positions", Tensor::from_vector<double>({0, 0, 0}, {1, 3}));
  batch.set("atoms_ptr", Tensor::from_vector<int64_t>({0, 1}, {2}));
  CHECK(error_message([&] { data::radius_graph_transform({.cutoff = 1.0})(batch); }) ==
        "radius_graph_transform: field 'positions' is float64 [1, 3]; expected float32 [1, 3]");
  CHECK(error_message([] { data::radius_graph_transform({.cutoff = -1.0}); }) ==
        "radius_graph_transform: the cutoff must be positive, got -1");
}
