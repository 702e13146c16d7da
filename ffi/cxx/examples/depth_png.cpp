// A photo's metric depth as a 16-bit PNG (millimetres), through moge alone:
//
//   moge_depth_png MODEL PHOTO OUT.png
//
// MODEL is a published name (vitl-normal, ...), a checkpoint path, or a server's URL.
#include "moge/moge.h"

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " MODEL PHOTO OUT.png\n";
    return 2;
  }
  try {
    auto model = moge::load(argv[1], moge::default_load_options());
    auto pred = model->infer_file(argv[2], moge::default_options());
    size_t clamped = pred->save_depth_png(argv[3], 0.001f);
    std::cout << argv[3] << ": " << pred->width() << "x" << pred->height() << ", fov_x " << pred->fov_x()
              << " deg, metric scale " << pred->metric_scale() << ", " << clamped << " pixels beyond 65.535 m\n";
  } catch (const rust::Error& e) {
    std::cerr << "moge: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
