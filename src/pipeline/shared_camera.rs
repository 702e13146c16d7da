//! `--camera shared`: one field of view (and, asked for, one metric scale) for the photos of one
//! camera: each folder's photos, each video's frames. A first pass runs the model on a sample
//! of each group (up to N photos spread evenly over its sorted list; a video's first N frames
//! taken) and takes the medians of their estimates; the run then gives each photo of the group
//! that field of view (the shift-only solve, as `--fov-x`) and that scale.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::config::Config;
use super::inputs::Input;
use super::record::Status;
use super::run::{run, Engine};
use crate::camera::SharedCamera;
use crate::geometry::median;

/// How the first pass samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sharing {
    /// Photos (frames) per group in the first pass.
    pub sample: usize,
    /// Share the metric scale too.
    pub scale: bool,
    /// Only videos' frames share (`--video-fov shared`); photos keep their own.
    pub videos_only: bool,
}

/// The group of an input: its video, or its photo's folder.
pub fn group_of(input: &Input) -> PathBuf {
    if input.is_video() || input.frame.is_some() {
        return input.path.clone();
    }
    input.path.parent().map(Path::to_owned).unwrap_or_default()
}

/// Up to `n` of `len` items, spread evenly, the first and the last among them.
fn spread(len: usize, n: usize) -> Vec<usize> {
    match (len, n) {
        (0, _) | (_, 0) => vec![],
        (l, n) if n >= l => (0..l).collect(),
        (l, 1) => vec![l / 2],
        (l, n) => {
            let mut v: Vec<usize> = (0..n).map(|i| (i * (l - 1) + (n - 1) / 2) / (n - 1)).collect();
            v.dedup();
            v
        }
    }
}

/// The first pass over `inputs` on `engine` with `cfg`'s model options: each group's camera.
/// A group whose sample gave no prediction has none (its photos keep their own estimates).
pub fn estimate(engine: Engine, inputs: &[Input], cfg: &Config, sharing: Sharing, stop: &Arc<AtomicBool>) -> BTreeMap<PathBuf, SharedCamera> {
    let mut groups: BTreeMap<PathBuf, Vec<&Input>> = BTreeMap::new();
    for input in inputs.iter().filter(|i| i.problem.is_none() && (!sharing.videos_only || i.is_video())) {
        groups.entry(group_of(input)).or_default().push(input);
    }
    let mut sample: Vec<Input> = Vec::new();
    for members in groups.values() {
        // A video is sampled by its first frames; the photos of a folder over their list.
        let (videos, photos): (Vec<&&Input>, Vec<&&Input>) = members.iter().partition(|i| i.is_video());
        sample.extend(videos.into_iter().map(|i| (*i).clone()));
        sample.extend(spread(photos.len(), sharing.sample).into_iter().map(|k| (*photos[k]).clone()));
    }
    let mut first = cfg.clone();
    first.outputs.formats.clear();
    first.keep_predictions = true;
    first.post = None;
    first.skip_existing = false;
    first.video_scale = None;
    first.frames.first = Some(sharing.sample as u64);
    first.plan.fov = crate::image_io::FovFrom::Estimate;
    first.plan.infer.fov_x = None;
    let index_group: Vec<PathBuf> = sample.iter().map(group_of).collect();
    let mut found: BTreeMap<PathBuf, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    run(engine, sample, &first, stop, |r| {
        if let (Status::Ok, Some(p)) = (r.status, &r.prediction) {
            let e = found.entry(index_group[r.index].clone()).or_default();
            e.0.push(p.fov_degrees().0 as f64);
            e.1.push(p.metric_scale as f64);
        }
    });
    found
        .into_iter()
        .filter(|(_, (f, _))| !f.is_empty())
        .map(|(group, (mut fovs, mut scales))| {
            let range = fovs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            let cam = SharedCamera {
                group: group.clone(),
                fov_x: median(&mut fovs) as f32,
                metric_scale: sharing.scale.then(|| median(&mut scales) as f32),
                sampled: fovs.len(),
                fov_x_range: (range.0 as f32, range.1 as f32),
            };
            (group, cam)
        })
        .collect()
}

/// Gives each input its group's camera, where the group has one.
pub fn attach(inputs: &mut [Input], cameras: &BTreeMap<PathBuf, SharedCamera>, sharing: Sharing) {
    for input in inputs.iter_mut().filter(|i| !sharing.videos_only || i.is_video()) {
        input.shared = cameras.get(&group_of(input)).cloned().map(Arc::new);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_is_spread_over_the_list() {
        assert_eq!(spread(10, 4), vec![0, 3, 6, 9]);
        assert_eq!(spread(3, 8), vec![0, 1, 2]);
        assert_eq!(spread(5, 1), vec![2]);
        assert_eq!(spread(100, 8).len(), 8);
        assert_eq!(*spread(100, 8).last().unwrap(), 99);
        assert!(spread(0, 8).is_empty());
    }
}
