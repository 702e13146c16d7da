//! `moge generate-assets DIR` (hidden): the man pages and shell completions, generated from
//! the clap definition. The committed `man/` and `completions/` are checked against it by
//! `tests/it/cli_assets.rs`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, CommandFactory};
use clap_complete::Shell;

#[derive(Args, Debug)]
pub struct AssetsArgs {
    /// Writes DIR/man/*.1 and DIR/completions/{moge.bash,_moge,moge.fish}.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// (relative path, contents) of every generated file.
pub fn generate() -> Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut cmd = super::Cli::command();
    cmd.build();
    let mut files = Vec::new();
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    files.push((PathBuf::from("man/moge.1"), page));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        let name = format!("moge-{}", sub.get_name());
        let mut page = Vec::new();
        clap_mangen::Man::new(sub.clone().name(name.clone())).render(&mut page)?;
        files.push((PathBuf::from(format!("man/{name}.1")), page));
    }
    for (shell, file) in [(Shell::Bash, "moge.bash"), (Shell::Zsh, "_moge"), (Shell::Fish, "moge.fish")] {
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut cmd, "moge", &mut buf);
        files.push((PathBuf::from(format!("completions/{file}")), buf));
    }
    Ok(files)
}

pub fn run(args: AssetsArgs) -> Result<i32> {
    for (rel, bytes) in generate()? {
        let path: PathBuf = Path::new(&args.dir).join(rel);
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).with_context(|| format!("{}: cannot create", d.display()))?;
        }
        std::fs::write(&path, bytes).with_context(|| format!("{}: cannot write", path.display()))?;
    }
    Ok(super::EXIT_OK)
}
