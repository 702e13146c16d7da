// The C++ library against the command line, with g++ as a user builds it: on the fixture
// checkpoint, the maps of infer_rgb (RGB, BGR, a row stride wider than the row) and infer_file
// equal `moge predict`'s npz for the same photo and options, bit for bit; threads share one
// model; every error path throws rust::Error with the command line's message; the accessors hand
// out the prediction's own memory. Exit status 0 when every check held; each failure is printed.
//
// MOGE_CLI (the moge binary) and MOGE_FIXTURES (tests/fixtures) come from CMakeLists.txt.

#include "moge/moge.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::cerr << "FAILED: " << what << "\n";
  }
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

uint32_t u32(const uint8_t* p) { return p[0] | p[1] << 8 | p[2] << 16 | uint32_t(p[3]) << 24; }
uint16_t u16(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }

// One array of an npz that `moge predict --npz-compression none` wrote: a zip of stored .npy
// entries, found through the zip's central directory.
struct Array {
  std::string dtype;
  std::vector<size_t> shape;
  std::vector<uint8_t> data;
};

std::map<std::string, Array> read_npz(const std::string& path) {
  std::map<std::string, Array> out;
  auto z = read_file(path);
  if (z.size() < 22) throw std::runtime_error(path + ": not a zip");
  size_t eocd = z.size() - 22;
  while (eocd > 0 && u32(&z[eocd]) != 0x06054b50) --eocd;
  size_t entries = u16(&z[eocd + 10]);
  size_t at = u32(&z[eocd + 16]);
  for (size_t e = 0; e < entries; ++e) {
    const uint8_t* c = &z[at];
    if (u32(c) != 0x02014b50) throw std::runtime_error(path + ": bad central directory");
    uint16_t method = u16(c + 10);
    size_t size = u32(c + 20), name_len = u16(c + 28), extra_len = u16(c + 30), comment_len = u16(c + 32);
    size_t local = u32(c + 42);
    std::string name(reinterpret_cast<const char*>(c + 46), name_len);
    at += 46 + name_len + extra_len + comment_len;
    if (method != 0) throw std::runtime_error(path + ": " + name + " is compressed");
    const uint8_t* l = &z[local];
    const uint8_t* npy = l + 30 + u16(l + 26) + u16(l + 28);
    // .npy: magic, version, header length, a Python dict, then the data.
    size_t header_len = npy[6] == 1 ? u16(npy + 8) : u32(npy + 8);
    size_t header_at = npy[6] == 1 ? 10 : 12;
    std::string header(reinterpret_cast<const char*>(npy + header_at), header_len);
    Array a;
    auto descr = header.find("'descr': '");
    a.dtype = header.substr(descr + 10, header.find('\'', descr + 10) - descr - 10);
    auto open = header.find('(', header.find("'shape'"));
    std::stringstream dims(header.substr(open + 1, header.find(')', open) - open - 1));
    for (std::string d; std::getline(dims, d, ',');)
      if (d.find_first_not_of(' ') != std::string::npos) a.shape.push_back(std::stoul(d));
    size_t data_at = header_at + header_len;
    a.data.assign(npy + data_at, npy + size);
    out[name.substr(0, name.size() - 4)] = a;
  }
  return out;
}

// A photo of w x h with every pixel different, as RGB rows without padding.
std::vector<uint8_t> photo(uint32_t w, uint32_t h) {
  std::vector<uint8_t> rgb(size_t(w) * h * 3);
  for (uint32_t y = 0; y < h; ++y)
    for (uint32_t x = 0; x < w; ++x) {
      uint8_t* p = &rgb[(size_t(y) * w + x) * 3];
      p[0] = uint8_t(x * 255 / w);
      p[1] = uint8_t(y * 255 / h);
      p[2] = uint8_t((x * 7 + y * 13) % 256);
    }
  return rgb;
}

// The same pixels as a 24-bit BMP (bottom-up BGR rows, each padded to 4 bytes), for the CLI.
void write_bmp(const std::string& path, const std::vector<uint8_t>& rgb, uint32_t w, uint32_t h) {
  uint32_t row = (w * 3 + 3) & ~3u, size = 54 + row * h;
  std::vector<uint8_t> b(size, 0);
  auto put32 = [&](size_t at, uint32_t v) { for (int i = 0; i < 4; ++i) b[at + i] = uint8_t(v >> (8 * i)); };
  b[0] = 'B'; b[1] = 'M';
  put32(2, size); put32(10, 54); put32(14, 40); put32(18, w); put32(22, h);
  b[26] = 1; b[28] = 24; put32(34, row * h);
  for (uint32_t y = 0; y < h; ++y)
    for (uint32_t x = 0; x < w; ++x) {
      const uint8_t* s = &rgb[(size_t(y) * w + x) * 3];
      uint8_t* d = &b[54 + size_t(h - 1 - y) * row + x * 3];
      d[0] = s[2]; d[1] = s[1]; d[2] = s[0];
    }
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

template <typename T>
bool same_bits(rust::Slice<const T> got, const Array& want) {
  return got.size() * sizeof(T) == want.data.size() && std::memcmp(got.data(), want.data.data(), want.data.size()) == 0;
}

// Every map of `p` equals the npz's, bit for bit.
void check_equal(const moge::Prediction& p, std::map<std::string, Array>& npz, const std::string& what) {
  check(p.width() == npz["depth"].shape.at(1) && p.height() == npz["depth"].shape.at(0), what + ": size");
  check(npz["points"].dtype == "<f4" && same_bits(p.points(), npz["points"]), what + ": points");
  check(same_bits(p.depth(), npz["depth"]), what + ": depth");
  check(npz["normal"].dtype == "<f4" && p.has_normal() && same_bits(p.normal(), npz["normal"]), what + ": normal");
  check(npz["mask"].dtype == "|u1" && same_bits(p.mask(), npz["mask"]), what + ": mask");
  float k[9];
  std::memcpy(k, npz["intrinsics"].data.data(), sizeof k);
  auto in = p.intrinsics();
  check(in.fx == k[0] && in.cx == k[2] && in.fy == k[4] && in.cy == k[5], what + ": intrinsics");
  float scale, got = p.metric_scale();
  std::memcpy(&scale, npz["metric_scale"].data.data(), 4);
  check(std::memcmp(&scale, &got, 4) == 0, what + ": metric scale");
}

// The message of the rust::Error `f` throws; "" when it throws none.
template <typename F>
std::string thrown(F f) {
  try {
    f();
  } catch (const rust::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

int main() {
  const std::string fixtures = MOGE_FIXTURES;
  const std::string weights = fixtures + "/tiny_normal.pt";
  const uint32_t w = 64, h = 48;
  auto rgb = photo(w, h);
  write_bmp("photo.bmp", rgb, w, h);
  // The reference: the command line on the same file and options.
  std::string cli = std::string(MOGE_CLI) + " predict photo.bmp -o cli --weights " + weights +
                    " --precision f32 --device cpu --num-tokens 600 --fov-x 55 --npz-compression none --npz-normal-dtype float32 > cli.txt";
  if (std::system(cli.c_str()) != 0) {
    std::cerr << "FAILED: " << cli << "\n";
    return 1;
  }
  auto npz = read_npz("cli/photo.npz");

  auto load = moge::default_load_options();
  load.precision = "f32";
  load.device = "cpu";
  auto model = moge::load(weights, load);
  check(model->has_normal() && std::string(model->device()) == "cpu", "model");
  auto opts = moge::default_options();
  opts.num_tokens = 600;
  opts.fov_x = 55;

  auto from_rgb = model->infer_rgb(rgb.data(), w, h, size_t(w) * 3, opts);
  check_equal(*from_rgb, npz, "infer_rgb (RGB)");
  check_equal(*model->infer_file("photo.bmp", opts), npz, "infer_file");

  // BGR, as OpenCV holds images.
  std::vector<uint8_t> bgr(rgb.size());
  for (size_t i = 0; i < rgb.size(); i += 3) { bgr[i] = rgb[i + 2]; bgr[i + 1] = rgb[i + 1]; bgr[i + 2] = rgb[i]; }
  auto bgr_opts = opts;
  bgr_opts.bgr = true;
  check_equal(*model->infer_rgb(bgr.data(), w, h, size_t(w) * 3, bgr_opts), npz, "infer_rgb (BGR)");

  // Rows padded to 256 bytes (a cv::Mat cut from a larger one), the padding full of noise.
  const size_t stride = 256;
  std::vector<uint8_t> padded(stride * h, 0xA5);
  for (uint32_t y = 0; y < h; ++y) std::memcpy(&padded[y * stride], &rgb[size_t(y) * w * 3], size_t(w) * 3);
  check_equal(*model->infer_rgb(padded.data(), w, h, stride, opts), npz, "infer_rgb (row stride 256)");

  // The accessors hand out the prediction's memory: the same pointers each time (an accessor that
  // copied would give a new buffer per call), sizes as said.
  check(from_rgb->depth().data() == from_rgb->depth().data() && from_rgb->points().data() == from_rgb->points().data(), "no copy");
  check(from_rgb->points().size() == size_t(w) * h * 3 && from_rgb->mask().size() == size_t(w) * h, "sizes");
  check(std::fabs(from_rgb->fov_x() - 55.0f) < 1e-3f, "fov_x as given");

  // MoGe-3 (its fixture has no normal head): refine steps as the command line's --refine-steps,
  // the CLI's depth and mask bit for bit; 0 steps differ; a MoGe-2 model refuses steps.
  {
    const std::string w3 = fixtures + "/moge3/tiny_moge3.pt";
    std::string cli3 = std::string(MOGE_CLI) + " predict photo.bmp -o cli3 --weights " + w3 +
                       " --precision f32 --device cpu --num-tokens 60 --refine-steps 2 --npz-compression none > cli3.txt";
    check(std::system(cli3.c_str()) == 0, cli3);
    auto npz3 = read_npz("cli3/photo.npz");
    auto m3 = moge::load(w3, load);
    auto o3 = moge::default_options();
    o3.num_tokens = 60;
    o3.refine_steps = 2;
    auto refined = m3->infer_file("photo.bmp", o3);
    check(same_bits(refined->depth(), npz3["depth"]) && same_bits(refined->mask(), npz3["mask"]), "MoGe-3, 2 refine steps: the CLI's depth and mask");
    o3.refine_steps = 0;
    check(!same_bits(m3->infer_file("photo.bmp", o3)->depth(), npz3["depth"]), "MoGe-3, 0 refine steps: not the 2 steps' depth");
    auto bad3 = moge::default_options();
    bad3.refine_steps = 1;
    auto e3 = thrown([&] { model->infer_file("photo.bmp", bad3); });
    check(contains(e3, "no refiner"), "MoGe-2 asked for refine steps: " + e3);
  }

  // int8 products: close to f32's depth, not equal to it.
  auto load8 = load;
  load8.precision = "int8";
  auto int8 = moge::load(weights, load8)->infer_rgb(rgb.data(), w, h, size_t(w) * 3, opts);
  std::vector<float> rel;
  bool differs = false;
  for (size_t i = 0; i < from_rgb->depth().size(); ++i) {
    float a = from_rgb->depth()[i], b = int8->depth()[i];
    differs |= a != b;
    if (std::isfinite(a) && std::isfinite(b) && a > 0) rel.push_back(std::fabs(b / a - 1.0f));
  }
  check(differs && rel.size() > from_rgb->depth().size() / 2, "int8 changes the depth");
  std::nth_element(rel.begin(), rel.begin() + rel.size() / 2, rel.end());
  check(rel[rel.size() / 2] < 0.01f, "int8 depth within 1 % of f32's (median)");
  auto px = from_rgb->intrinsics_pixels();
  check(std::fabs(px.fx - from_rgb->intrinsics().fx * w) < 1e-3f, "intrinsics in pixels");

  // Threads sharing the model: each result the command line's.
  const Array& want_depth = npz.at("depth");
  const Array& want_points = npz.at("points");
  std::vector<std::thread> threads;
  std::vector<int> same(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      auto p = model->infer_rgb(rgb.data(), w, h, size_t(w) * 3, opts);
      same[t] = same_bits(p->depth(), want_depth) && same_bits(p->points(), want_points);
    });
  for (auto& t : threads) t.join();
  for (int t = 0; t < 4; ++t) check(same[t], "thread " + std::to_string(t));

  // The camera's own field of view from a photo's EXIF (26 mm in 35 mm terms, 80x60):
  // 2 atan(diagonal of 36x24 / (2 * 26) * 80 / 100).
  auto exif_opts = opts;
  exif_opts.fov_x = 0;
  exif_opts.fov_x_exif = true;
  const double want_fov = 2 * std::atan(std::hypot(36.0, 24.0) / 52.0 * 0.8) * 180 / M_PI;
  auto from_exif = model->infer_file(fixtures + "/images/exif_f35_26mm_80x60.jpg", exif_opts);
  check(std::fabs(from_exif->fov_x() - want_fov) < 1e-3, "fov_x from EXIF: " + std::to_string(from_exif->fov_x()));
  auto no_exif = model->infer_file("photo.bmp", exif_opts);
  check(std::fabs(no_exif->fov_x() - 55.0f) > 1e-3f, "no EXIF: estimated");

  // The outputs moge writes, from C++.
  check(from_rgb->save_depth_png("depth.png", 0.001f) == 0, "save_depth_png");
  from_rgb->save_npz("again.npz");
  auto again = read_npz("again.npz");
  check(again["depth"].data == npz["depth"].data, "save_npz");

  // Every error is a rust::Error with the command line's message.
  auto e = thrown([&] { model->infer_file("no-such-photo.jpg", opts); });
  check(contains(e, "no-such-photo.jpg") && contains(e, "No such file"), "missing file: " + e);
  auto png = read_file(fixtures + "/images/rgb_64x48.png");
  std::ofstream("cut.png", std::ios::binary).write(reinterpret_cast<const char*>(png.data()), png.size() / 2);
  e = thrown([&] { model->infer_file("cut.png", opts); });
  check(contains(e, "cut.png") && contains(e, "truncated"), "damaged photo: " + e);
  std::ofstream("bad.pt") << "not a checkpoint";
  e = thrown([&] { moge::load("bad.pt", load); });
  check(contains(e, "bad.pt"), "bad checkpoint: " + e);
  e = thrown([&] { moge::load(fixtures + "/no-such.pt", load); });
  check(contains(e, "no-such.pt"), "missing checkpoint: " + e);
  auto bad = opts;
  bad.fit = "sideways";
  e = thrown([&] { model->infer_rgb(rgb.data(), w, h, size_t(w) * 3, bad); });
  check(contains(e, "sideways"), "bad fit: " + e);
  bad = opts;
  bad.resolution_level = 4;
  e = thrown([&] { model->infer_rgb(rgb.data(), w, h, size_t(w) * 3, bad); });
  check(contains(e, "not both"), "num_tokens and resolution_level: " + e);
  bad = opts;
  bad.fov_x = -5;
  e = thrown([&] { model->infer_rgb(rgb.data(), w, h, size_t(w) * 3, bad); });
  check(!e.empty(), "negative fov_x: " + e);
  bad = opts;
  bad.fov_x_exif = true;
  e = thrown([&] { model->infer_file("photo.bmp", bad); });
  check(contains(e, "fov_x_exif"), "fov_x and fov_x_exif: " + e);
  bad.fov_x = 0;
  e = thrown([&] { model->infer_rgb(rgb.data(), w, h, size_t(w) * 3, bad); });
  check(contains(e, "needs a photo file"), "fov_x_exif on pixels: " + e);
  auto bad_load = load;
  bad_load.precision = "f64";
  e = thrown([&] { moge::load(weights, bad_load); });
  check(contains(e, "f64"), "bad precision: " + e);
  e = thrown([&] { model->infer_rgb(rgb.data(), w, h, size_t(w) * 2, opts); });
  check(contains(e, "row stride"), "short stride: " + e);
  e = thrown([&] { model->infer_rgb(nullptr, w, h, size_t(w) * 3, opts); });
  check(contains(e, "null"), "null data: " + e);
  e = thrown([&] { model->infer_rgb(rgb.data(), 0, h, 0, opts); });
  check(contains(e, "0x48"), "zero width: " + e);
  e = thrown([&] { from_rgb->save_depth_png("depth.png", 0.0f); });
  check(contains(e, "scale"), "bad depth scale: " + e);
  e = thrown([&] { moge::load("http://127.0.0.1:9", load); });
  check(contains(e, "cannot reach the server at http://127.0.0.1:9"), "unreachable server: " + e);

  if (failures == 0) std::cout << "moge C++ tests: all checks held\n";
  return failures == 0 ? 0 : 1;
}
