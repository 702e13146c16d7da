//! The library's choices as the command line offers them: one clap value enum each, in the
//! order `--help` lists them and with the help each value shows, converted both ways.

use clap::ValueEnum;
use moge::fit::FitMode;
use moge::outputs::npz::{Compression, NormalDtype};
use moge::outputs::Format;

/// `From` both ways between a command-line value enum and the library's, variant for variant.
macro_rules! same_variants {
    ($arg:ident, $lib:ident, { $($variant:ident),+ $(,)? }) => {
        impl From<$arg> for $lib {
            fn from(a: $arg) -> Self {
                match a {
                    $($arg::$variant => $lib::$variant),+
                }
            }
        }

        impl From<$lib> for $arg {
            fn from(v: $lib) -> Self {
                match v {
                    $($lib::$variant => $arg::$variant),+
                }
            }
        }
    };
}

/// `--format`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatArg {
    /// `x.npz`: the npz of the Tenstorrent MoGe-2 server (tt-MoGe): points, depth, normal, mask, intrinsics, ...
    Npz,
    /// `x.depth.png` (16-bit, metres = value x scale, 0 = invalid), `x.normal.png`, `x.mask.png`, and the sidecar.
    Png,
    /// `x.json`: the sidecar (size, field of view, intrinsics, metric scale, depth statistics, ...).
    Json,
    /// `x.depth.exr` and `x.points.exr`: float32, inf where invalid.
    Exr,
    /// `x.ply`: binary point cloud with colours (and normals), upstream axes, edges removed.
    Ply,
    /// `x.glb`: textured triangle mesh, upstream axes, edges removed.
    Glb,
    /// `x.depth_vis.png` and `x.normal_vis.png`: colourised images to look at.
    Vis,
    /// `clip.depth.mp4` beside a video's frames: their depth, colourised (disparity, one range for the whole video), as a video made by ffmpeg.
    Mp4,
    /// `x.colmap/{cameras,images,points3D}.txt`: the photo as a COLMAP text model (a PINHOLE camera with MoGe's intrinsics, the identity pose, up to 100k points of the point map, coloured).
    Colmap,
}

same_variants!(FormatArg, Format, { Npz, Png, Json, Exr, Ply, Glb, Vis, Mp4, Colmap });

/// `--npz-compression`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompressionArg {
    /// Stored as they are (`np.savez`): the fastest to write and to read, the largest.
    None,
    /// Deflate level 1: float maps take several times less time than numpy's default level 6,
    /// at a small cost in size.
    Fast,
    /// Deflate level 9 (`np.savez_compressed` is level 6): the smallest, the slowest.
    Small,
}

same_variants!(CompressionArg, Compression, { None, Fast, Small });

/// `--npz-normal-dtype`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormalDtypeArg {
    /// As upstream `infer()` returns it.
    Float32,
    /// IEEE half, rounded to nearest even as numpy's `astype(np.float16)`: the layout of the
    /// Tenstorrent MoGe-2 server (tt-MoGe), half the bytes (unit normals keep ~3 decimal digits).
    Float16,
}

same_variants!(NormalDtypeArg, NormalDtype, { Float32, Float16 });

/// `--fit`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitArg {
    /// Each photo at its own aspect (upstream behaviour).
    Exact,
    /// Letterbox onto the canvas aspect, crop the outputs back.
    Pad,
    /// Stretch onto the canvas, resample the outputs back.
    Stretch,
}

same_variants!(FitArg, FitMode, { Exact, Pad, Stretch });

#[cfg(test)]
mod tests {
    use super::*;

    /// The command line's names are the library's, so that what `--help` lists is what the
    /// library parses and writes (the sidecar's `fit`, for one).
    #[test]
    fn names_are_the_librarys() {
        fn same<A: ValueEnum + Copy + Into<L>, L: std::fmt::Display>() {
            for a in A::value_variants() {
                let name = a.to_possible_value().unwrap().get_name().to_owned();
                assert_eq!((*a).into().to_string(), name);
            }
        }
        same::<FormatArg, Format>();
        same::<CompressionArg, Compression>();
        same::<NormalDtypeArg, NormalDtype>();
        same::<FitArg, FitMode>();
    }
}
