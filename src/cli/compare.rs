//! `moge compare A B`: how far the predictions in B are from those in A (two npz files, or two
//! output directories of the same photos), photo by photo and at worst, as a table or JSON;
//! exit 1 past the gates given.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use super::{EXIT_OK, EXIT_SOME_FAILED};
use moge::compare::{figures, Figures, Gates};

#[derive(Args, Debug)]
#[command(after_help = "Exit status: 0 within the gates, 1 past a gate or photos on one side only, 2 usage or unreadable files.")]
pub struct CompareArgs {
    /// The reference: an npz file, or an output directory (every npz under it).
    #[arg(value_name = "A")]
    pub a: PathBuf,
    /// What is compared with it: an npz file, or an output directory of the same photos.
    #[arg(value_name = "B")]
    pub b: PathBuf,
    /// Print one JSON object: each photo's figures, the worst, the gates and what failed them.
    #[arg(long)]
    pub json: bool,
    /// Lowest PCC of points, depth and normal over the pixels valid in both.
    #[arg(long, value_name = "P")]
    pub min_pcc: Option<f64>,
    /// Largest median of |depth_B - depth_A| / depth_A.
    #[arg(long, value_name = "E")]
    pub max_depth_rel_median: Option<f64>,
    /// Largest |depth_B - depth_A| / depth_A at any pixel.
    #[arg(long, value_name = "E")]
    pub max_depth_rel: Option<f64>,
    /// Lowest intersection over union of the validity masks.
    #[arg(long, value_name = "IOU")]
    pub min_mask_iou: Option<f64>,
    /// Largest difference of fov_x or fov_y, degrees.
    #[arg(long, value_name = "DEG")]
    pub max_fov_diff: Option<f64>,
    /// Largest difference of the metric scales, as max(r, 1/r) - 1 of their ratio r.
    #[arg(long, value_name = "R")]
    pub max_scale_diff: Option<f64>,
}

#[derive(Serialize)]
struct Photo {
    name: String,
    #[serde(flatten)]
    figures: Figures,
    failed: Vec<String>,
}

#[derive(Serialize)]
struct Report {
    a: String,
    b: String,
    photos: Vec<Photo>,
    worst: Option<Figures>,
    gates: Gates,
    only_in_a: Vec<String>,
    only_in_b: Vec<String>,
    passed: bool,
}

/// The npz files under `dir`, by path relative to it.
fn npz_under(dir: &Path) -> Result<BTreeSet<PathBuf>> {
    let mut out = BTreeSet::new();
    for e in walkdir::WalkDir::new(dir).follow_links(true) {
        let e = e.with_context(|| format!("{}: cannot read", dir.display()))?;
        if e.file_type().is_file() && e.path().extension().is_some_and(|x| x.eq_ignore_ascii_case("npz")) {
            out.insert(e.path().strip_prefix(dir).unwrap_or(e.path()).to_owned());
        }
    }
    Ok(out)
}

fn read(path: &Path) -> Result<moge::Prediction> {
    let bytes = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    moge::remote::read_prediction(&bytes).with_context(|| format!("{}", path.display()))
}

pub fn run(args: CompareArgs) -> Result<i32> {
    let gates = Gates {
        min_pcc: args.min_pcc,
        max_depth_rel_median: args.max_depth_rel_median,
        max_depth_rel: args.max_depth_rel,
        min_mask_iou: args.min_mask_iou,
        max_fov_diff: args.max_fov_diff,
        max_scale_diff: args.max_scale_diff,
    };
    let (pairs, only_in_a, only_in_b) = match (args.a.is_dir(), args.b.is_dir()) {
        (true, true) => {
            let (a, b) = (npz_under(&args.a)?, npz_under(&args.b)?);
            let pairs: Vec<PathBuf> = a.intersection(&b).cloned().collect();
            let only = |x: &BTreeSet<PathBuf>, y: &BTreeSet<PathBuf>| x.difference(y).map(|p| p.display().to_string()).collect::<Vec<_>>();
            if pairs.is_empty() {
                bail!("{} and {} have no npz file in common (by path under each)", args.a.display(), args.b.display());
            }
            (pairs.into_iter().map(|p| (p.display().to_string(), args.a.join(&p), args.b.join(&p))).collect(), only(&a, &b), only(&b, &a))
        }
        (false, false) => {
            let name = args.b.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            (vec![(name, args.a.clone(), args.b.clone())], vec![], vec![])
        }
        _ => bail!("compare two npz files or two directories, not one of each ({} and {})", args.a.display(), args.b.display()),
    };
    let mut photos = Vec::with_capacity(pairs.len());
    for (name, a, b) in pairs {
        let f = figures(&read(&a)?, &read(&b)?).with_context(|| format!("{} and {}", a.display(), b.display()))?;
        photos.push(Photo { name, failed: gates.failures(&f), figures: f });
    }
    let worst = Figures::worst(&photos.iter().map(|p| p.figures).collect::<Vec<_>>());
    let passed = photos.iter().all(|p| p.failed.is_empty()) && only_in_a.is_empty() && only_in_b.is_empty();
    let report = Report { a: args.a.display().to_string(), b: args.b.display().to_string(), photos, worst, gates, only_in_a, only_in_b, passed };
    if args.json {
        moge::outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(if report.passed { EXIT_OK } else { EXIT_SOME_FAILED })
}

fn print_table(r: &Report) {
    let cell = |v: Option<f64>, digits: usize| v.map_or("-".to_owned(), |v| format!("{v:.digits$}"));
    let row = |name: &str, f: &Figures| {
        format!(
            "{name:<28} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8} {:>7} {:>7} {:>8}",
            cell(f.points_pcc, 6),
            cell(f.depth_pcc, 6),
            cell(f.normal_pcc, 6),
            cell(f.depth_rel_median, 6),
            cell(f.depth_rel_max, 6),
            format!("{:.5}", f.mask_iou),
            format!("{:.3}", f.fov_x_diff),
            format!("{:.3}", f.fov_y_diff),
            format!("{:.5}", f.scale_ratio),
        )
    };
    moge::outln!(
        "{:<28} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8} {:>7} {:>7} {:>8}",
        "photo",
        "pts PCC",
        "dep PCC",
        "nrm PCC",
        "med rel",
        "max rel",
        "mask IoU",
        "dfov_x",
        "dfov_y",
        "scale"
    );
    for p in &r.photos {
        moge::outln!("{}", row(&p.name, &p.figures));
    }
    if let (Some(w), true) = (&r.worst, r.photos.len() > 1) {
        moge::outln!("{}", row(&format!("worst of {}", r.photos.len()), w));
    }
    for (side, names) in [("A", &r.only_in_a), ("B", &r.only_in_b)] {
        for n in names.iter() {
            moge::errln!("moge: {n}: only in {side}");
        }
    }
    for p in &r.photos {
        for f in &p.failed {
            moge::errln!("moge: {}: {f}", p.name);
        }
    }
}
