fn main() {
    std::process::exit(moge::cli::main());
}
