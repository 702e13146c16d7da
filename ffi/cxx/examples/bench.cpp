// Seconds per infer_rgb on one synthetic photo, for scripts/bench-cxx.sh, which runs it beside
// examples/infer_bench.rs (the Rust library's Model::infer on the same pixels):
//
//   moge_bench MODEL WIDTH HEIGHT RUNS
//
// f32 on the CPU, 1800 tokens; one call first (not timed), then RUNS timed calls; prints the
// median in milliseconds.
#include "moge/moge.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL WIDTH HEIGHT RUNS\n", argv[0]);
    return 2;
  }
  const uint32_t w = std::stoul(argv[2]), h = std::stoul(argv[3]);
  const int runs = std::stoi(argv[4]);
  // The pixels examples/infer_bench.rs makes.
  std::vector<uint8_t> rgb(size_t(w) * h * 3);
  for (uint32_t y = 0; y < h; ++y)
    for (uint32_t x = 0; x < w; ++x) {
      uint8_t* p = &rgb[(size_t(y) * w + x) * 3];
      p[0] = uint8_t(x * 255 / w);
      p[1] = uint8_t(y * 255 / h);
      p[2] = uint8_t((x * 7 + y * 13) % 256);
    }
  try {
    auto load = moge::default_load_options();
    load.precision = "f32";
    load.device = "cpu";
    auto model = moge::load(argv[1], load);
    auto opts = moge::default_options();
    model->infer_rgb(rgb.data(), w, h, size_t(w) * 3, opts);
    std::vector<double> ms;
    for (int i = 0; i < runs; ++i) {
      auto t = std::chrono::steady_clock::now();
      auto pred = model->infer_rgb(rgb.data(), w, h, size_t(w) * 3, opts);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%.2f\n", ms[ms.size() / 2]);
  } catch (const rust::Error& e) {
    std::fprintf(stderr, "moge: %s\n", e.what());
    return 1;
  }
  return 0;
}
