//! The C++ half of the bridge: cxx generates `moge-cxx/src/lib.rs.h` (installed as
//! `moge/moge.h`) and the glue it compiles here into the static library.

fn main() {
    cxx_build::bridge("src/lib.rs").std("c++17").compile("moge-cxx-bridge");
    println!("cargo:rerun-if-changed=src/lib.rs");
}
