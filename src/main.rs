//! The `moge` command line ([`cli`]) over the `moge` library.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
