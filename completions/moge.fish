# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_moge_global_optspecs
    string join \n h/help V/version
end

function __fish_moge_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_moge_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_moge_using_subcommand
    set -l cmd (__fish_moge_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c moge -n "__fish_moge_needs_command" -s h -l help -d 'Print help'
complete -c moge -n "__fish_moge_needs_command" -s V -l version -d 'Print version'
complete -c moge -n "__fish_moge_needs_command" -f -a "predict" -d 'Predict geometry for image files'
complete -c moge -n "__fish_moge_needs_command" -f -a "batch" -d 'Predict geometry for every photo under directories, streaming, outputs in a mirrored tree'
complete -c moge -n "__fish_moge_needs_command" -f -a "panorama" -d '360° equirectangular panoramas: twelve views through the model, merged into one metric distance map'
complete -c moge -n "__fish_moge_needs_command" -f -a "colmap" -d 'Depth for every image of a COLMAP reconstruction, with its camera, at the reconstruction\'s scale (depth priors for Gaussian splatting and NeRF)'
complete -c moge -n "__fish_moge_needs_command" -f -a "serve" -d 'Keep the model loaded and answer HTTP requests with the API of the Tenstorrent MoGe-2 server (tt-MoGe)'
complete -c moge -n "__fish_moge_needs_command" -f -a "bench" -d 'Time the model: cold start, warm per-image time, stages, peak memory'
complete -c moge -n "__fish_moge_needs_command" -f -a "compare" -d 'How far the predictions in B are from those in A (npz files or output directories): PCC, depth error, mask IoU, fov, scale'
complete -c moge -n "__fish_moge_needs_command" -f -a "quantize" -d 'Store a checkpoint\'s weights in int8 (a scale per channel), a quarter of the size, for --precision int8'
complete -c moge -n "__fish_moge_needs_command" -f -a "download" -d 'Fetch published models into the Hugging Face cache ahead of time'
complete -c moge -n "__fish_moge_needs_command" -f -a "info" -d 'List the published models: which are cached, where, their size and sha256'
complete -c moge -n "__fish_moge_needs_command" -f -a "models" -d 'List the published models: which are cached, where, their size and sha256'
complete -c moge -n "__fish_moge_needs_command" -f -a "generate-assets" -d 'Write the man pages and shell completions (for packagers)'
complete -c moge -n "__fish_moge_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c moge -n "__fish_moge_using_subcommand predict" -s o -l output -d 'Output directory: IMAGE\'s stem + .npz (and the other formats\' suffixes) goes here' -r -F
complete -c moge -n "__fish_moge_using_subcommand predict" -l weights -d 'A local checkpoint: upstream model.pt, or .safetensors with its JSON config beside it' -r -F
complete -c moge -n "__fish_moge_using_subcommand predict" -l model -d 'A published model, fetched from the Hugging Face hub on first use' -r -f -a "vits-normal\t''
vitb-normal\t''
vitl-normal\t''
vitl\t''
moge3-vitl\t''
moge3-vitg\t''"
complete -c moge -n "__fish_moge_using_subcommand predict" -l revision -d 'Branch, tag or commit of the published model\'s repo' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l precision -d 'Arithmetic of the network. auto: bf16 on a CUDA GPU, on an Intel CPU with AMX tiles, and on a CPU whose AVX512-BF16 beats f32 (AMD Zen 4 and later; every output keeps PCC >= 0.9999 against upstream fp32), else f32; f32 for number-for-number parity; int8 (never auto) for int8 products' -r -f -a "auto\t'bf16 where the CPU runs bf16 products faster than f32 (AMX tiles; AVX512-BF16 on AMD Zen 4 and later), else f32'
f32\t'Exact float32, the parity reference'
bf16\t'bf16 products with f32 accumulation (AMD AVX512-BF16 CPUs: several times faster; on Intel\'s, slower than f32)'
int8\t'The ViT\'s linears, the decoder\'s convolutions and MoGe-3\'s refiner convolutions as int8 products (weights per channel, activations per token, pixel or voxel), the rest f32; CPU only, fast with AVX512-VNNI (Intel Xeon since Cascade Lake, AMD Zen 4 and later) or AVX-VNNI (Intel Core since Alder Lake). Never chosen by auto: check what it costs on your photos with `moge compare`'"
complete -c moge -n "__fish_moge_using_subcommand predict" -l device -d 'Where the network runs: auto (a CUDA GPU where this moge has CUDA and the driver sees one, else the CPU), cpu, cuda or cuda:N' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l num-tokens -d 'Base ViT tokens (more: finer and slower). Upstream suggests 1200..2500' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l resolution-level -d 'Upstream\'s resolution level 0..9 (1200..3600 tokens); replaces --num-tokens' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l fov-x -d 'Known horizontal field of view in degrees (otherwise it is recovered); `exif`: each photo\'s from its EXIF focal length (FocalLengthIn35mmFilm, or FocalLength with FocalPlaneXResolution), recovered where the photo has none (the sidecar\'s `inference.fov_x_source` says which)' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l intrinsics -d 'The camera matrix in pixels, where it is known (the image\'s top-left corner at 0,0, as COLMAP has it; OpenCV\'s cx, cy are 0.5 less). Used whole: where fx != fy or the principal point is off the centre, the photo is resampled to square pixels and placed with the principal point at the centre of a larger view, and the outputs mapped back to the photo\'s pixels and this camera' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l intrinsics-from -d 'Each photo\'s own camera matrix, used whole as --intrinsics is: a CSV of name,fx,fy,cx,cy (with or without a header), or a JSON of name: [fx, fy, cx, cy], or nerfstudio\'s transforms.json. A name is the photo\'s path or its end (`x.jpg`, `sub/x.jpg`); a photo without a row fails, the rest run' -r -F
complete -c moge -n "__fish_moge_using_subcommand predict" -l refine-steps -d 'MoGe-3\'s refinement passes over the depth (default 3; 0 gives the MoGe-2 output of the same network, about 1.5x faster). MoGe-2 models have none' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l format -d 'Output formats, a comma list' -r -f -a "npz\t'`x.npz`: the npz of the Tenstorrent MoGe-2 server (tt-MoGe): points, depth, normal, mask, intrinsics, ...'
png\t'`x.depth.png` (16-bit, metres = value x scale, 0 = invalid), `x.normal.png`, `x.mask.png`, and the sidecar'
json\t'`x.json`: the sidecar (size, field of view, intrinsics, metric scale, depth statistics, ...)'
exr\t'`x.depth.exr` and `x.points.exr`: float32, inf where invalid'
ply\t'`x.ply`: binary point cloud with colours (and normals), upstream axes, edges removed'
glb\t'`x.glb`: textured triangle mesh, upstream axes, edges removed'
vis\t'`x.depth_vis.png` and `x.normal_vis.png`: colourised images to look at'
mp4\t'`clip.depth.mp4` beside a video\'s frames: their depth, colourised (disparity, one range for the whole video), as a video made by ffmpeg'
colmap\t'`x.colmap/{cameras,images,points3D}.txt`: the photo as a COLMAP text model (a PINHOLE camera with MoGe\'s intrinsics, the identity pose, up to 100k points of the point map, coloured)'"
complete -c moge -n "__fish_moge_using_subcommand predict" -l depth-scale -d 'Metres per unit of the 16-bit depth PNG (0 = invalid; values beyond 65535 saturate)' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l edge-rtol -d 'Relative depth jump over a 3x3 neighbourhood that removes a pixel from ply / glb (\'inf\' keeps all); default 0.04 for a photo, 0.03 for a panorama (upstream\'s defaults; a panorama\'s pixel goes only where its surface also turns)' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l npz-compression -d 'How npz arrays are stored: none (np.savez, the fastest), fast (deflate level 1: smaller, several times slower to write), small (deflate level 9)' -r -f -a "none\t'Stored as they are (`np.savez`): the fastest to write and to read, the largest'
fast\t'Deflate level 1: float maps take several times less time than numpy\'s default level 6, at a small cost in size'
small\t'Deflate level 9 (`np.savez_compressed` is level 6): the smallest, the slowest'"
complete -c moge -n "__fish_moge_using_subcommand predict" -l npz-normal-dtype -d 'Element type of the npz normal: float32, or float16 as the Tenstorrent MoGe-2 server (tt-MoGe) sends it' -r -f -a "float32\t'As upstream `infer()` returns it'
float16\t'IEEE half, rounded to nearest even as numpy\'s `astype(np.float16)`: the layout of the Tenstorrent MoGe-2 server (tt-MoGe), half the bytes (unit normals keep ~3 decimal digits)'"
complete -c moge -n "__fish_moge_using_subcommand predict" -l max-megapixels -d 'Refuse images larger than this, from their header, before decoding (a small damaged or hostile file can claim any size)' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l server -d 'Send the photos to a running server (`moge serve`, or the Tenstorrent MoGe-2 server (tt-MoGe)) instead of loading a model here; photos are decoded and outputs written here. Given more than once (or as a comma list): a pool, each photo going to the least loaded server that is up; a server that fails is taken out, its photos sent to the others, and taken back when it answers `/health` again' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l in-flight -d 'Requests in flight at once to each server (so that its device never waits)' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l server-timeout -d 'Seconds one request to the server may take before it is retried (in a pool: sent to another server)' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l server-retries -d 'Retries of a request that failed for the network\'s or the server\'s sake (no connection, a timeout, 5xx, 503 busy); a refused photo (4xx) is not retried. In a pool, a photo that got no answer goes to another server at once, one that got 5xx once the retries are spent' -r
complete -c moge -n "__fish_moge_using_subcommand predict" -l no-mask -d 'Keep invalid pixels (no inf / zero normals outside the mask)'
complete -c moge -n "__fish_moge_using_subcommand predict" -l no-force-projection -d 'Keep the predicted x, y instead of re-projecting the depth through the intrinsics'
complete -c moge -n "__fish_moge_using_subcommand predict" -l per-step -d 'MoGe-3: also keep each refine step\'s maps, in the npz as upstream\'s `points_per_step`, `depth_per_step`, `intrinsics_per_step` (and `mask_per_step`), step 0 unrefined'
complete -c moge -n "__fish_moge_using_subcommand predict" -l no-compress -d 'Same as --npz-compression none'
complete -c moge -n "__fish_moge_using_subcommand predict" -l no-exif -d 'Keep the raw pixel order of JPEG/TIFF/WebP files (do not apply the EXIF orientation)'
complete -c moge -n "__fish_moge_using_subcommand predict" -l allow-truncated -d 'Process truncated JPEG/PNG/WebP files anyway (the missing part is filled in by the decoder), with a warning for each, instead of failing them'
complete -c moge -n "__fish_moge_using_subcommand predict" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c moge -n "__fish_moge_using_subcommand batch" -l from-list -d 'Also read image paths from FILE, one per line (\'-\' for stdin; \'#\' starts a comment)' -r -F
complete -c moge -n "__fish_moge_using_subcommand batch" -s o -l output -d 'Output directory: DIR/sub/x.jpg gives OUT/sub/x.<kind>' -r -F
complete -c moge -n "__fish_moge_using_subcommand batch" -l weights -d 'A local checkpoint: upstream model.pt, or .safetensors with its JSON config beside it' -r -F
complete -c moge -n "__fish_moge_using_subcommand batch" -l model -d 'A published model, fetched from the Hugging Face hub on first use' -r -f -a "vits-normal\t''
vitb-normal\t''
vitl-normal\t''
vitl\t''
moge3-vitl\t''
moge3-vitg\t''"
complete -c moge -n "__fish_moge_using_subcommand batch" -l revision -d 'Branch, tag or commit of the published model\'s repo' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l precision -d 'Arithmetic of the network. auto: bf16 on a CUDA GPU, on an Intel CPU with AMX tiles, and on a CPU whose AVX512-BF16 beats f32 (AMD Zen 4 and later; every output keeps PCC >= 0.9999 against upstream fp32), else f32; f32 for number-for-number parity; int8 (never auto) for int8 products' -r -f -a "auto\t'bf16 where the CPU runs bf16 products faster than f32 (AMX tiles; AVX512-BF16 on AMD Zen 4 and later), else f32'
f32\t'Exact float32, the parity reference'
bf16\t'bf16 products with f32 accumulation (AMD AVX512-BF16 CPUs: several times faster; on Intel\'s, slower than f32)'
int8\t'The ViT\'s linears, the decoder\'s convolutions and MoGe-3\'s refiner convolutions as int8 products (weights per channel, activations per token, pixel or voxel), the rest f32; CPU only, fast with AVX512-VNNI (Intel Xeon since Cascade Lake, AMD Zen 4 and later) or AVX-VNNI (Intel Core since Alder Lake). Never chosen by auto: check what it costs on your photos with `moge compare`'"
complete -c moge -n "__fish_moge_using_subcommand batch" -l device -d 'Where the network runs: auto (a CUDA GPU where this moge has CUDA and the driver sees one, else the CPU), cpu, cuda or cuda:N' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l num-tokens -d 'Base ViT tokens (more: finer and slower). Upstream suggests 1200..2500' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l resolution-level -d 'Upstream\'s resolution level 0..9 (1200..3600 tokens); replaces --num-tokens' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l fov-x -d 'Known horizontal field of view in degrees (otherwise it is recovered); `exif`: each photo\'s from its EXIF focal length (FocalLengthIn35mmFilm, or FocalLength with FocalPlaneXResolution), recovered where the photo has none (the sidecar\'s `inference.fov_x_source` says which)' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l intrinsics -d 'The camera matrix in pixels, where it is known (the image\'s top-left corner at 0,0, as COLMAP has it; OpenCV\'s cx, cy are 0.5 less). Used whole: where fx != fy or the principal point is off the centre, the photo is resampled to square pixels and placed with the principal point at the centre of a larger view, and the outputs mapped back to the photo\'s pixels and this camera' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l intrinsics-from -d 'Each photo\'s own camera matrix, used whole as --intrinsics is: a CSV of name,fx,fy,cx,cy (with or without a header), or a JSON of name: [fx, fy, cx, cy], or nerfstudio\'s transforms.json. A name is the photo\'s path or its end (`x.jpg`, `sub/x.jpg`); a photo without a row fails, the rest run' -r -F
complete -c moge -n "__fish_moge_using_subcommand batch" -l refine-steps -d 'MoGe-3\'s refinement passes over the depth (default 3; 0 gives the MoGe-2 output of the same network, about 1.5x faster). MoGe-2 models have none' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l format -d 'Output formats, a comma list' -r -f -a "npz\t'`x.npz`: the npz of the Tenstorrent MoGe-2 server (tt-MoGe): points, depth, normal, mask, intrinsics, ...'
png\t'`x.depth.png` (16-bit, metres = value x scale, 0 = invalid), `x.normal.png`, `x.mask.png`, and the sidecar'
json\t'`x.json`: the sidecar (size, field of view, intrinsics, metric scale, depth statistics, ...)'
exr\t'`x.depth.exr` and `x.points.exr`: float32, inf where invalid'
ply\t'`x.ply`: binary point cloud with colours (and normals), upstream axes, edges removed'
glb\t'`x.glb`: textured triangle mesh, upstream axes, edges removed'
vis\t'`x.depth_vis.png` and `x.normal_vis.png`: colourised images to look at'
mp4\t'`clip.depth.mp4` beside a video\'s frames: their depth, colourised (disparity, one range for the whole video), as a video made by ffmpeg'
colmap\t'`x.colmap/{cameras,images,points3D}.txt`: the photo as a COLMAP text model (a PINHOLE camera with MoGe\'s intrinsics, the identity pose, up to 100k points of the point map, coloured)'"
complete -c moge -n "__fish_moge_using_subcommand batch" -l depth-scale -d 'Metres per unit of the 16-bit depth PNG (0 = invalid; values beyond 65535 saturate)' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l edge-rtol -d 'Relative depth jump over a 3x3 neighbourhood that removes a pixel from ply / glb (\'inf\' keeps all); default 0.04 for a photo, 0.03 for a panorama (upstream\'s defaults; a panorama\'s pixel goes only where its surface also turns)' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l npz-compression -d 'How npz arrays are stored: none (np.savez, the fastest), fast (deflate level 1: smaller, several times slower to write), small (deflate level 9)' -r -f -a "none\t'Stored as they are (`np.savez`): the fastest to write and to read, the largest'
fast\t'Deflate level 1: float maps take several times less time than numpy\'s default level 6, at a small cost in size'
small\t'Deflate level 9 (`np.savez_compressed` is level 6): the smallest, the slowest'"
complete -c moge -n "__fish_moge_using_subcommand batch" -l npz-normal-dtype -d 'Element type of the npz normal: float32, or float16 as the Tenstorrent MoGe-2 server (tt-MoGe) sends it' -r -f -a "float32\t'As upstream `infer()` returns it'
float16\t'IEEE half, rounded to nearest even as numpy\'s `astype(np.float16)`: the layout of the Tenstorrent MoGe-2 server (tt-MoGe), half the bytes (unit normals keep ~3 decimal digits)'"
complete -c moge -n "__fish_moge_using_subcommand batch" -l max-megapixels -d 'Refuse images larger than this, from their header, before decoding (a small damaged or hostile file can claim any size)' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l server -d 'Send the photos to a running server (`moge serve`, or the Tenstorrent MoGe-2 server (tt-MoGe)) instead of loading a model here; photos are decoded and outputs written here. Given more than once (or as a comma list): a pool, each photo going to the least loaded server that is up; a server that fails is taken out, its photos sent to the others, and taken back when it answers `/health` again' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l in-flight -d 'Requests in flight at once to each server (so that its device never waits)' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l server-timeout -d 'Seconds one request to the server may take before it is retried (in a pool: sent to another server)' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l server-retries -d 'Retries of a request that failed for the network\'s or the server\'s sake (no connection, a timeout, 5xx, 503 busy); a refused photo (4xx) is not retried. In a pool, a photo that got no answer goes to another server at once, one that got 5xx once the retries are spent' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l every -d 'Take every Nth frame of each video, from the first (frames keep their numbers in the video: --every 10 gives 000000, 000010, ...)' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l fps -d 'Take at most F frames per second of each video\'s time: the first frame at or after each 1/F s' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l video-scale -d 'Each frame\'s metric scale: raw (the frame\'s own estimate, which flickers from frame to frame) or smooth (a running estimate over the frames before it, in log scale, with a time constant of 1 s, or T seconds with smooth=T; the sidecar keeps the frame\'s own in frame.metric_scale_raw)' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l video-fov -d 'Each frame\'s field of view: raw (the frame\'s own estimate), shared (one for the whole video: the median over its first --camera-sample frames taken; as --camera shared, for videos only) or smooth (a running estimate over the frames up to it, of log tan(fov/2), with a time constant of 1 s or T seconds with smooth=T; each frame is solved twice, a model run here only; the sidecar keeps the frame\'s own in frame.fov_x_raw)' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l camera -d 'per-photo, or shared: the photos of each folder (the frames of each video) were taken by one camera at one zoom; a first pass runs the model on --camera-sample of them (spread evenly over the folder\'s sorted list; a video\'s first frames taken) and every photo of the group then gets the median field of view (the sidecar\'s shared_camera says which)' -r -f -a "per-photo\t'Each photo\'s field of view its own (estimated, or as given)'
shared\t'One field of view per folder of photos and per video: the median over a first pass'"
complete -c moge -n "__fish_moge_using_subcommand batch" -l camera-sample -d 'Photos (frames) per folder (video) in the first pass of --camera shared / --video-fov shared' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l fit -d 'How photos meet the network: at their own aspect, or padded / stretched onto --canvas (one token grid for every photo); outputs always have the photo\'s size' -r -f -a "exact\t'Each photo at its own aspect (upstream behaviour)'
pad\t'Letterbox onto the canvas aspect, crop the outputs back'
stretch\t'Stretch onto the canvas, resample the outputs back'"
complete -c moge -n "__fish_moge_using_subcommand batch" -l canvas -d 'The canvas of --fit pad / stretch' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -s j -l jobs -d 'Host threads for each host stage (decode, post-process and write); default: the number of CPUs, at most 8' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l shard -d 'Process only shard I of N (0-based; each photo belongs to exactly one shard, by a hash of its output path). auto: the shard of this task of a Slurm job array (SLURM_ARRAY_TASK_ID, _MIN and _COUNT) or a Kubernetes indexed Job (JOB_COMPLETION_INDEX, of N with auto/N, or of JOB_COMPLETIONS)' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l view-size -d 'With --panorama: each of the twelve views\' size in pixels (upstream\'s: 512)' -r
complete -c moge -n "__fish_moge_using_subcommand batch" -l no-mask -d 'Keep invalid pixels (no inf / zero normals outside the mask)'
complete -c moge -n "__fish_moge_using_subcommand batch" -l no-force-projection -d 'Keep the predicted x, y instead of re-projecting the depth through the intrinsics'
complete -c moge -n "__fish_moge_using_subcommand batch" -l per-step -d 'MoGe-3: also keep each refine step\'s maps, in the npz as upstream\'s `points_per_step`, `depth_per_step`, `intrinsics_per_step` (and `mask_per_step`), step 0 unrefined'
complete -c moge -n "__fish_moge_using_subcommand batch" -l no-compress -d 'Same as --npz-compression none'
complete -c moge -n "__fish_moge_using_subcommand batch" -l no-exif -d 'Keep the raw pixel order of JPEG/TIFF/WebP files (do not apply the EXIF orientation)'
complete -c moge -n "__fish_moge_using_subcommand batch" -l allow-truncated -d 'Process truncated JPEG/PNG/WebP files anyway (the missing part is filled in by the decoder), with a warning for each, instead of failing them'
complete -c moge -n "__fish_moge_using_subcommand batch" -l shared-scale -d 'With --camera shared or --video-fov shared, share the metric scale too (the median of the first pass; the sidecar keeps each photo\'s own as shared_camera.metric_scale_own)'
complete -c moge -n "__fish_moge_using_subcommand batch" -l skip-existing -d 'Skip photos whose requested outputs all exist (resume an interrupted run)'
complete -c moge -n "__fish_moge_using_subcommand batch" -s q -l quiet -d 'No progress bar and no summary (errors are still printed)'
complete -c moge -n "__fish_moge_using_subcommand batch" -l json -d 'Print one JSON line per photo on stdout: input, status, outputs, timings, error'
complete -c moge -n "__fish_moge_using_subcommand batch" -l stats -d 'Print where the time goes per stage, and throughput against forwards alone'
complete -c moge -n "__fish_moge_using_subcommand batch" -l panorama -d 'Every input is a 360° equirectangular panorama: `moge panorama`\'s work and outputs, with this command\'s listing, --shard, --skip-existing and --json'
complete -c moge -n "__fish_moge_using_subcommand batch" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c moge -n "__fish_moge_using_subcommand panorama" -l from-list -d 'Also read panorama paths from FILE, one per line (\'-\' for stdin; \'#\' starts a comment)' -r -F
complete -c moge -n "__fish_moge_using_subcommand panorama" -s o -l output -d 'Output directory: PANORAMA\'s stem + .npz (and the other formats\' suffixes) goes here, a directory\'s tree mirrored' -r -F
complete -c moge -n "__fish_moge_using_subcommand panorama" -l view-size -d 'Each of the twelve views\' size in pixels (upstream\'s: 512)' -r
complete -c moge -n "__fish_moge_using_subcommand panorama" -l server -d 'A running `moge serve` that runs the views instead of a model loaded here' -r
complete -c moge -n "__fish_moge_using_subcommand panorama" -l shard -d 'Process only shard I of N, as `moge batch --shard` (auto: the Slurm array task\'s or the Kubernetes indexed Job\'s)' -r
complete -c moge -n "__fish_moge_using_subcommand panorama" -l weights -d 'A local checkpoint: upstream model.pt, or .safetensors with its JSON config beside it' -r -F
complete -c moge -n "__fish_moge_using_subcommand panorama" -l model -d 'A published model, fetched from the Hugging Face hub on first use' -r -f -a "vits-normal\t''
vitb-normal\t''
vitl-normal\t''
vitl\t''
moge3-vitl\t''
moge3-vitg\t''"
complete -c moge -n "__fish_moge_using_subcommand panorama" -l revision -d 'Branch, tag or commit of the published model\'s repo' -r
complete -c moge -n "__fish_moge_using_subcommand panorama" -l precision -d 'Arithmetic of the network. auto: bf16 on a CUDA GPU, on an Intel CPU with AMX tiles, and on a CPU whose AVX512-BF16 beats f32 (AMD Zen 4 and later; every output keeps PCC >= 0.9999 against upstream fp32), else f32; f32 for number-for-number parity; int8 (never auto) for int8 products' -r -f -a "auto\t'bf16 where the CPU runs bf16 products faster than f32 (AMX tiles; AVX512-BF16 on AMD Zen 4 and later), else f32'
f32\t'Exact float32, the parity reference'
bf16\t'bf16 products with f32 accumulation (AMD AVX512-BF16 CPUs: several times faster; on Intel\'s, slower than f32)'
int8\t'The ViT\'s linears, the decoder\'s convolutions and MoGe-3\'s refiner convolutions as int8 products (weights per channel, activations per token, pixel or voxel), the rest f32; CPU only, fast with AVX512-VNNI (Intel Xeon since Cascade Lake, AMD Zen 4 and later) or AVX-VNNI (Intel Core since Alder Lake). Never chosen by auto: check what it costs on your photos with `moge compare`'"
complete -c moge -n "__fish_moge_using_subcommand panorama" -l device -d 'Where the network runs: auto (a CUDA GPU where this moge has CUDA and the driver sees one, else the CPU), cpu, cuda or cuda:N' -r
complete -c moge -n "__fish_moge_using_subcommand panorama" -l num-tokens -d 'Base ViT tokens (more: finer and slower). Upstream suggests 1200..2500' -r
complete -c moge -n "__fish_moge_using_subcommand panorama" -l resolution-level -d 'Upstream\'s resolution level 0..9 (1200..3600 tokens); replaces --num-tokens' -r
complete -c moge -n "__fish_moge_using_subcommand panorama" -l fov-x -d 'Known horizontal field of view in degrees (otherwise it is recovered); `exif`: each photo\'s from its EXIF focal length (FocalLengthIn35mmFilm, or FocalLength with FocalPlaneXResolution), recovered where the photo has none (the sidecar\'s `inference.fov_x_source` says which)' -r
complete -c moge -n "__fish_moge_using_subcommand panorama" -l intrinsics -d 'The camera matrix in pixels, where it is known (the image\'s top-left corner at 0,0, as COLMAP has it; OpenCV\'s cx, cy are 0.5 less). Used whole: where fx != fy or the principal point is off the centre, the photo is resampled to square pixels and placed with the principal point at the centre of a larger view, and the outputs mapped back to the photo\'s pixels and this camera' -r
complete -c moge -n "__fish_moge_using_subcommand panorama" -l intrinsics-from -d 'Each photo\'s own camera matrix, used whole as --intrinsics is: a CSV of name,fx,fy,cx,cy (with or without a header), or a JSON of name: [fx, fy, cx, cy], or nerfstudio\'s transforms.json. A name is the photo\'s path or its end (`x.jpg`, `sub/x.jpg`); a photo without a row fails, the rest run' -r -F
complete -c moge -n "__fish_moge_using_subcommand panorama" -l refine-steps -d 'MoGe-3\'s refinement passes over the depth (default 3; 0 gives the MoGe-2 output of the same network, about 1.5x faster). MoGe-2 models have none' -r
complete -c moge -n "__fish_moge_using_subcommand panorama" -l format -d 'Output formats, a comma list' -r -f -a "npz\t'`x.npz`: the npz of the Tenstorrent MoGe-2 server (tt-MoGe): points, depth, normal, mask, intrinsics, ...'
png\t'`x.depth.png` (16-bit, metres = value x scale, 0 = invalid), `x.normal.png`, `x.mask.png`, and the sidecar'
json\t'`x.json`: the sidecar (size, field of view, intrinsics, metric scale, depth statistics, ...)'
exr\t'`x.depth.exr` and `x.points.exr`: float32, inf where invalid'
ply\t'`x.ply`: binary point cloud with colours (and normals), upstream axes, edges removed'
glb\t'`x.glb`: textured triangle mesh, upstream axes, edges removed'
vis\t'`x.depth_vis.png` and `x.normal_vis.png`: colourised images to look at'
mp4\t'`clip.depth.mp4` beside a video\'s frames: their depth, colourised (disparity, one range for the whole video), as a video made by ffmpeg'
colmap\t'`x.colmap/{cameras,images,points3D}.txt`: the photo as a COLMAP text model (a PINHOLE camera with MoGe\'s intrinsics, the identity pose, up to 100k points of the point map, coloured)'"
complete -c moge -n "__fish_moge_using_subcommand panorama" -l depth-scale -d 'Metres per unit of the 16-bit depth PNG (0 = invalid; values beyond 65535 saturate)' -r
complete -c moge -n "__fish_moge_using_subcommand panorama" -l edge-rtol -d 'Relative depth jump over a 3x3 neighbourhood that removes a pixel from ply / glb (\'inf\' keeps all); default 0.04 for a photo, 0.03 for a panorama (upstream\'s defaults; a panorama\'s pixel goes only where its surface also turns)' -r
complete -c moge -n "__fish_moge_using_subcommand panorama" -l npz-compression -d 'How npz arrays are stored: none (np.savez, the fastest), fast (deflate level 1: smaller, several times slower to write), small (deflate level 9)' -r -f -a "none\t'Stored as they are (`np.savez`): the fastest to write and to read, the largest'
fast\t'Deflate level 1: float maps take several times less time than numpy\'s default level 6, at a small cost in size'
small\t'Deflate level 9 (`np.savez_compressed` is level 6): the smallest, the slowest'"
complete -c moge -n "__fish_moge_using_subcommand panorama" -l npz-normal-dtype -d 'Element type of the npz normal: float32, or float16 as the Tenstorrent MoGe-2 server (tt-MoGe) sends it' -r -f -a "float32\t'As upstream `infer()` returns it'
float16\t'IEEE half, rounded to nearest even as numpy\'s `astype(np.float16)`: the layout of the Tenstorrent MoGe-2 server (tt-MoGe), half the bytes (unit normals keep ~3 decimal digits)'"
complete -c moge -n "__fish_moge_using_subcommand panorama" -l max-megapixels -d 'Refuse images larger than this, from their header, before decoding (a small damaged or hostile file can claim any size)' -r
complete -c moge -n "__fish_moge_using_subcommand panorama" -l json -d 'One JSON line per panorama on stdout instead of a sentence'
complete -c moge -n "__fish_moge_using_subcommand panorama" -s q -l quiet -d 'No line per panorama (errors are still printed)'
complete -c moge -n "__fish_moge_using_subcommand panorama" -l skip-existing -d 'Skip panoramas whose requested outputs all exist (resume an interrupted run)'
complete -c moge -n "__fish_moge_using_subcommand panorama" -l no-mask -d 'Keep invalid pixels (no inf / zero normals outside the mask)'
complete -c moge -n "__fish_moge_using_subcommand panorama" -l no-force-projection -d 'Keep the predicted x, y instead of re-projecting the depth through the intrinsics'
complete -c moge -n "__fish_moge_using_subcommand panorama" -l per-step -d 'MoGe-3: also keep each refine step\'s maps, in the npz as upstream\'s `points_per_step`, `depth_per_step`, `intrinsics_per_step` (and `mask_per_step`), step 0 unrefined'
complete -c moge -n "__fish_moge_using_subcommand panorama" -l no-compress -d 'Same as --npz-compression none'
complete -c moge -n "__fish_moge_using_subcommand panorama" -l no-exif -d 'Keep the raw pixel order of JPEG/TIFF/WebP files (do not apply the EXIF orientation)'
complete -c moge -n "__fish_moge_using_subcommand panorama" -l allow-truncated -d 'Process truncated JPEG/PNG/WebP files anyway (the missing part is filled in by the decoder), with a warning for each, instead of failing them'
complete -c moge -n "__fish_moge_using_subcommand panorama" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c moge -n "__fish_moge_using_subcommand colmap" -l images -d 'The folder the model\'s image names are relative to' -r -F
complete -c moge -n "__fish_moge_using_subcommand colmap" -s o -l output -d 'Output directory: depth/NAME.npy and .png, depths/NAME.png with depth_params.json (3D Gaussian Splatting\'s layout), normals/NAME.png, NAME.json' -r -F
complete -c moge -n "__fish_moge_using_subcommand colmap" -l format -d 'Also write these per image, in the reconstruction\'s units (json: the sidecar, always)' -r -f -a "npz\t'`x.npz`: the npz of the Tenstorrent MoGe-2 server (tt-MoGe): points, depth, normal, mask, intrinsics, ...'
png\t'`x.depth.png` (16-bit, metres = value x scale, 0 = invalid), `x.normal.png`, `x.mask.png`, and the sidecar'
json\t'`x.json`: the sidecar (size, field of view, intrinsics, metric scale, depth statistics, ...)'
exr\t'`x.depth.exr` and `x.points.exr`: float32, inf where invalid'
ply\t'`x.ply`: binary point cloud with colours (and normals), upstream axes, edges removed'
glb\t'`x.glb`: textured triangle mesh, upstream axes, edges removed'
vis\t'`x.depth_vis.png` and `x.normal_vis.png`: colourised images to look at'
mp4\t'`clip.depth.mp4` beside a video\'s frames: their depth, colourised (disparity, one range for the whole video), as a video made by ffmpeg'
colmap\t'`x.colmap/{cameras,images,points3D}.txt`: the photo as a COLMAP text model (a PINHOLE camera with MoGe\'s intrinsics, the identity pose, up to 100k points of the point map, coloured)'"
complete -c moge -n "__fish_moge_using_subcommand colmap" -l weights -d 'A local checkpoint: upstream model.pt, or .safetensors with its JSON config beside it' -r -F
complete -c moge -n "__fish_moge_using_subcommand colmap" -l model -d 'A published model, fetched from the Hugging Face hub on first use' -r -f -a "vits-normal\t''
vitb-normal\t''
vitl-normal\t''
vitl\t''
moge3-vitl\t''
moge3-vitg\t''"
complete -c moge -n "__fish_moge_using_subcommand colmap" -l revision -d 'Branch, tag or commit of the published model\'s repo' -r
complete -c moge -n "__fish_moge_using_subcommand colmap" -l precision -d 'Arithmetic of the network. auto: bf16 on a CUDA GPU, on an Intel CPU with AMX tiles, and on a CPU whose AVX512-BF16 beats f32 (AMD Zen 4 and later; every output keeps PCC >= 0.9999 against upstream fp32), else f32; f32 for number-for-number parity; int8 (never auto) for int8 products' -r -f -a "auto\t'bf16 where the CPU runs bf16 products faster than f32 (AMX tiles; AVX512-BF16 on AMD Zen 4 and later), else f32'
f32\t'Exact float32, the parity reference'
bf16\t'bf16 products with f32 accumulation (AMD AVX512-BF16 CPUs: several times faster; on Intel\'s, slower than f32)'
int8\t'The ViT\'s linears, the decoder\'s convolutions and MoGe-3\'s refiner convolutions as int8 products (weights per channel, activations per token, pixel or voxel), the rest f32; CPU only, fast with AVX512-VNNI (Intel Xeon since Cascade Lake, AMD Zen 4 and later) or AVX-VNNI (Intel Core since Alder Lake). Never chosen by auto: check what it costs on your photos with `moge compare`'"
complete -c moge -n "__fish_moge_using_subcommand colmap" -l device -d 'Where the network runs: auto (a CUDA GPU where this moge has CUDA and the driver sees one, else the CPU), cpu, cuda or cuda:N' -r
complete -c moge -n "__fish_moge_using_subcommand colmap" -l num-tokens -d 'Base ViT tokens (more: finer and slower). Upstream suggests 1200..2500' -r
complete -c moge -n "__fish_moge_using_subcommand colmap" -l resolution-level -d 'Upstream\'s resolution level 0..9 (1200..3600 tokens); replaces --num-tokens' -r
complete -c moge -n "__fish_moge_using_subcommand colmap" -l fov-x -d 'Known horizontal field of view in degrees (otherwise it is recovered); `exif`: each photo\'s from its EXIF focal length (FocalLengthIn35mmFilm, or FocalLength with FocalPlaneXResolution), recovered where the photo has none (the sidecar\'s `inference.fov_x_source` says which)' -r
complete -c moge -n "__fish_moge_using_subcommand colmap" -l intrinsics -d 'The camera matrix in pixels, where it is known (the image\'s top-left corner at 0,0, as COLMAP has it; OpenCV\'s cx, cy are 0.5 less). Used whole: where fx != fy or the principal point is off the centre, the photo is resampled to square pixels and placed with the principal point at the centre of a larger view, and the outputs mapped back to the photo\'s pixels and this camera' -r
complete -c moge -n "__fish_moge_using_subcommand colmap" -l intrinsics-from -d 'Each photo\'s own camera matrix, used whole as --intrinsics is: a CSV of name,fx,fy,cx,cy (with or without a header), or a JSON of name: [fx, fy, cx, cy], or nerfstudio\'s transforms.json. A name is the photo\'s path or its end (`x.jpg`, `sub/x.jpg`); a photo without a row fails, the rest run' -r -F
complete -c moge -n "__fish_moge_using_subcommand colmap" -l refine-steps -d 'MoGe-3\'s refinement passes over the depth (default 3; 0 gives the MoGe-2 output of the same network, about 1.5x faster). MoGe-2 models have none' -r
complete -c moge -n "__fish_moge_using_subcommand colmap" -l max-megapixels -d 'Refuse images larger than this, from their header, before decoding (a small damaged or hostile file can claim any size)' -r
complete -c moge -n "__fish_moge_using_subcommand colmap" -l server -d 'Send the photos to a running server (`moge serve`, or the Tenstorrent MoGe-2 server (tt-MoGe)) instead of loading a model here; photos are decoded and outputs written here. Given more than once (or as a comma list): a pool, each photo going to the least loaded server that is up; a server that fails is taken out, its photos sent to the others, and taken back when it answers `/health` again' -r
complete -c moge -n "__fish_moge_using_subcommand colmap" -l in-flight -d 'Requests in flight at once to each server (so that its device never waits)' -r
complete -c moge -n "__fish_moge_using_subcommand colmap" -l server-timeout -d 'Seconds one request to the server may take before it is retried (in a pool: sent to another server)' -r
complete -c moge -n "__fish_moge_using_subcommand colmap" -l server-retries -d 'Retries of a request that failed for the network\'s or the server\'s sake (no connection, a timeout, 5xx, 503 busy); a refused photo (4xx) is not retried. In a pool, a photo that got no answer goes to another server at once, one that got 5xx once the retries are spent' -r
complete -c moge -n "__fish_moge_using_subcommand colmap" -s j -l jobs -d 'Host threads for each host stage (decode, fit and write); default: the number of CPUs, at most 8' -r
complete -c moge -n "__fish_moge_using_subcommand colmap" -l no-mask -d 'Keep invalid pixels (no inf / zero normals outside the mask)'
complete -c moge -n "__fish_moge_using_subcommand colmap" -l no-force-projection -d 'Keep the predicted x, y instead of re-projecting the depth through the intrinsics'
complete -c moge -n "__fish_moge_using_subcommand colmap" -l per-step -d 'MoGe-3: also keep each refine step\'s maps, in the npz as upstream\'s `points_per_step`, `depth_per_step`, `intrinsics_per_step` (and `mask_per_step`), step 0 unrefined'
complete -c moge -n "__fish_moge_using_subcommand colmap" -l no-exif -d 'Keep the raw pixel order of JPEG/TIFF/WebP files (do not apply the EXIF orientation)'
complete -c moge -n "__fish_moge_using_subcommand colmap" -l allow-truncated -d 'Process truncated JPEG/PNG/WebP files anyway (the missing part is filled in by the decoder), with a warning for each, instead of failing them'
complete -c moge -n "__fish_moge_using_subcommand colmap" -s q -l quiet -d 'No progress bar and no summary (errors are still printed)'
complete -c moge -n "__fish_moge_using_subcommand colmap" -l json -d 'Print one JSON line per image on stdout: input, status, outputs, timings, error'
complete -c moge -n "__fish_moge_using_subcommand colmap" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c moge -n "__fish_moge_using_subcommand serve" -l weights -d 'A local checkpoint: upstream model.pt, or .safetensors with its JSON config beside it' -r -F
complete -c moge -n "__fish_moge_using_subcommand serve" -l model -d 'A published model, fetched from the Hugging Face hub on first use' -r -f -a "vits-normal\t''
vitb-normal\t''
vitl-normal\t''
vitl\t''
moge3-vitl\t''
moge3-vitg\t''"
complete -c moge -n "__fish_moge_using_subcommand serve" -l revision -d 'Branch, tag or commit of the published model\'s repo' -r
complete -c moge -n "__fish_moge_using_subcommand serve" -l precision -d 'Arithmetic of the network. auto: bf16 on a CUDA GPU, on an Intel CPU with AMX tiles, and on a CPU whose AVX512-BF16 beats f32 (AMD Zen 4 and later; every output keeps PCC >= 0.9999 against upstream fp32), else f32; f32 for number-for-number parity; int8 (never auto) for int8 products' -r -f -a "auto\t'bf16 where the CPU runs bf16 products faster than f32 (AMX tiles; AVX512-BF16 on AMD Zen 4 and later), else f32'
f32\t'Exact float32, the parity reference'
bf16\t'bf16 products with f32 accumulation (AMD AVX512-BF16 CPUs: several times faster; on Intel\'s, slower than f32)'
int8\t'The ViT\'s linears, the decoder\'s convolutions and MoGe-3\'s refiner convolutions as int8 products (weights per channel, activations per token, pixel or voxel), the rest f32; CPU only, fast with AVX512-VNNI (Intel Xeon since Cascade Lake, AMD Zen 4 and later) or AVX-VNNI (Intel Core since Alder Lake). Never chosen by auto: check what it costs on your photos with `moge compare`'"
complete -c moge -n "__fish_moge_using_subcommand serve" -l device -d 'Where the network runs: auto (a CUDA GPU where this moge has CUDA and the driver sees one, else the CPU), cpu, cuda or cuda:N' -r
complete -c moge -n "__fish_moge_using_subcommand serve" -l host -d 'Address to listen on (127.0.0.1: this machine only; 0.0.0.0 or :: for every interface)' -r
complete -c moge -n "__fish_moge_using_subcommand serve" -l port -d 'Port; when it is taken, the next free one above it (0: any free port)' -r
complete -c moge -n "__fish_moge_using_subcommand serve" -s j -l jobs -d 'Host threads for decoding and for encoding, each; default: the number of CPUs, at most 8' -r
complete -c moge -n "__fish_moge_using_subcommand serve" -l queue -d 'Requests in progress at most; past it the answer is 503 with Retry-After. Memory grows with it: 8 concurrent 1080p requests for base64 npz peaked at 590 MB with a small model (17 MB idle), the maps and their encodings of each' -r
complete -c moge -n "__fish_moge_using_subcommand serve" -l max-body-mb -d 'Largest request body in MB (413 above it)' -r
complete -c moge -n "__fish_moge_using_subcommand serve" -l max-tokens -d 'Largest num_tokens a request may ask for (memory and time grow with it)' -r
complete -c moge -n "__fish_moge_using_subcommand serve" -l canvas -d 'The canvas of fit: pad and fit: stretch' -r
complete -c moge -n "__fish_moge_using_subcommand serve" -l depth-scale -d 'Metres per unit of depth_png16' -r
complete -c moge -n "__fish_moge_using_subcommand serve" -l npz-compression -d 'How the npz arrays are stored (see `moge batch --help`)' -r -f -a "none\t'Stored as they are (`np.savez`): the fastest to write and to read, the largest'
fast\t'Deflate level 1: float maps take several times less time than numpy\'s default level 6, at a small cost in size'
small\t'Deflate level 9 (`np.savez_compressed` is level 6): the smallest, the slowest'"
complete -c moge -n "__fish_moge_using_subcommand serve" -l max-megapixels -d 'Refuse images larger than this, from their header, before decoding (a small damaged or hostile file can claim any size)' -r
complete -c moge -n "__fish_moge_using_subcommand serve" -l warmup -d 'Run one forward on a --canvas sized image before answering /health with 200, so that the first request is not slow'
complete -c moge -n "__fish_moge_using_subcommand serve" -l no-exif -d 'Keep the raw pixel order of JPEG/TIFF/WebP files (do not apply the EXIF orientation)'
complete -c moge -n "__fish_moge_using_subcommand serve" -l allow-truncated -d 'Process truncated JPEG/PNG/WebP files anyway (the missing part is filled in by the decoder), with a warning for each, instead of failing them'
complete -c moge -n "__fish_moge_using_subcommand serve" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c moge -n "__fish_moge_using_subcommand bench" -l size -d 'Size of the synthetic image, WxH' -r
complete -c moge -n "__fish_moge_using_subcommand bench" -l runs -d 'Timed runs after the warm-up' -r
complete -c moge -n "__fish_moge_using_subcommand bench" -l warmup -d 'Untimed warm-up runs' -r
complete -c moge -n "__fish_moge_using_subcommand bench" -l weights -d 'A local checkpoint: upstream model.pt, or .safetensors with its JSON config beside it' -r -F
complete -c moge -n "__fish_moge_using_subcommand bench" -l model -d 'A published model, fetched from the Hugging Face hub on first use' -r -f -a "vits-normal\t''
vitb-normal\t''
vitl-normal\t''
vitl\t''
moge3-vitl\t''
moge3-vitg\t''"
complete -c moge -n "__fish_moge_using_subcommand bench" -l revision -d 'Branch, tag or commit of the published model\'s repo' -r
complete -c moge -n "__fish_moge_using_subcommand bench" -l precision -d 'Arithmetic of the network. auto: bf16 on a CUDA GPU, on an Intel CPU with AMX tiles, and on a CPU whose AVX512-BF16 beats f32 (AMD Zen 4 and later; every output keeps PCC >= 0.9999 against upstream fp32), else f32; f32 for number-for-number parity; int8 (never auto) for int8 products' -r -f -a "auto\t'bf16 where the CPU runs bf16 products faster than f32 (AMX tiles; AVX512-BF16 on AMD Zen 4 and later), else f32'
f32\t'Exact float32, the parity reference'
bf16\t'bf16 products with f32 accumulation (AMD AVX512-BF16 CPUs: several times faster; on Intel\'s, slower than f32)'
int8\t'The ViT\'s linears, the decoder\'s convolutions and MoGe-3\'s refiner convolutions as int8 products (weights per channel, activations per token, pixel or voxel), the rest f32; CPU only, fast with AVX512-VNNI (Intel Xeon since Cascade Lake, AMD Zen 4 and later) or AVX-VNNI (Intel Core since Alder Lake). Never chosen by auto: check what it costs on your photos with `moge compare`'"
complete -c moge -n "__fish_moge_using_subcommand bench" -l device -d 'Where the network runs: auto (a CUDA GPU where this moge has CUDA and the driver sees one, else the CPU), cpu, cuda or cuda:N' -r
complete -c moge -n "__fish_moge_using_subcommand bench" -l num-tokens -d 'Base ViT tokens (more: finer and slower). Upstream suggests 1200..2500' -r
complete -c moge -n "__fish_moge_using_subcommand bench" -l resolution-level -d 'Upstream\'s resolution level 0..9 (1200..3600 tokens); replaces --num-tokens' -r
complete -c moge -n "__fish_moge_using_subcommand bench" -l fov-x -d 'Known horizontal field of view in degrees (otherwise it is recovered); `exif`: each photo\'s from its EXIF focal length (FocalLengthIn35mmFilm, or FocalLength with FocalPlaneXResolution), recovered where the photo has none (the sidecar\'s `inference.fov_x_source` says which)' -r
complete -c moge -n "__fish_moge_using_subcommand bench" -l intrinsics -d 'The camera matrix in pixels, where it is known (the image\'s top-left corner at 0,0, as COLMAP has it; OpenCV\'s cx, cy are 0.5 less). Used whole: where fx != fy or the principal point is off the centre, the photo is resampled to square pixels and placed with the principal point at the centre of a larger view, and the outputs mapped back to the photo\'s pixels and this camera' -r
complete -c moge -n "__fish_moge_using_subcommand bench" -l intrinsics-from -d 'Each photo\'s own camera matrix, used whole as --intrinsics is: a CSV of name,fx,fy,cx,cy (with or without a header), or a JSON of name: [fx, fy, cx, cy], or nerfstudio\'s transforms.json. A name is the photo\'s path or its end (`x.jpg`, `sub/x.jpg`); a photo without a row fails, the rest run' -r -F
complete -c moge -n "__fish_moge_using_subcommand bench" -l refine-steps -d 'MoGe-3\'s refinement passes over the depth (default 3; 0 gives the MoGe-2 output of the same network, about 1.5x faster). MoGe-2 models have none' -r
complete -c moge -n "__fish_moge_using_subcommand bench" -l format -d 'Output formats, a comma list' -r -f -a "npz\t'`x.npz`: the npz of the Tenstorrent MoGe-2 server (tt-MoGe): points, depth, normal, mask, intrinsics, ...'
png\t'`x.depth.png` (16-bit, metres = value x scale, 0 = invalid), `x.normal.png`, `x.mask.png`, and the sidecar'
json\t'`x.json`: the sidecar (size, field of view, intrinsics, metric scale, depth statistics, ...)'
exr\t'`x.depth.exr` and `x.points.exr`: float32, inf where invalid'
ply\t'`x.ply`: binary point cloud with colours (and normals), upstream axes, edges removed'
glb\t'`x.glb`: textured triangle mesh, upstream axes, edges removed'
vis\t'`x.depth_vis.png` and `x.normal_vis.png`: colourised images to look at'
mp4\t'`clip.depth.mp4` beside a video\'s frames: their depth, colourised (disparity, one range for the whole video), as a video made by ffmpeg'
colmap\t'`x.colmap/{cameras,images,points3D}.txt`: the photo as a COLMAP text model (a PINHOLE camera with MoGe\'s intrinsics, the identity pose, up to 100k points of the point map, coloured)'"
complete -c moge -n "__fish_moge_using_subcommand bench" -l depth-scale -d 'Metres per unit of the 16-bit depth PNG (0 = invalid; values beyond 65535 saturate)' -r
complete -c moge -n "__fish_moge_using_subcommand bench" -l edge-rtol -d 'Relative depth jump over a 3x3 neighbourhood that removes a pixel from ply / glb (\'inf\' keeps all); default 0.04 for a photo, 0.03 for a panorama (upstream\'s defaults; a panorama\'s pixel goes only where its surface also turns)' -r
complete -c moge -n "__fish_moge_using_subcommand bench" -l npz-compression -d 'How npz arrays are stored: none (np.savez, the fastest), fast (deflate level 1: smaller, several times slower to write), small (deflate level 9)' -r -f -a "none\t'Stored as they are (`np.savez`): the fastest to write and to read, the largest'
fast\t'Deflate level 1: float maps take several times less time than numpy\'s default level 6, at a small cost in size'
small\t'Deflate level 9 (`np.savez_compressed` is level 6): the smallest, the slowest'"
complete -c moge -n "__fish_moge_using_subcommand bench" -l npz-normal-dtype -d 'Element type of the npz normal: float32, or float16 as the Tenstorrent MoGe-2 server (tt-MoGe) sends it' -r -f -a "float32\t'As upstream `infer()` returns it'
float16\t'IEEE half, rounded to nearest even as numpy\'s `astype(np.float16)`: the layout of the Tenstorrent MoGe-2 server (tt-MoGe), half the bytes (unit normals keep ~3 decimal digits)'"
complete -c moge -n "__fish_moge_using_subcommand bench" -l no-mask -d 'Keep invalid pixels (no inf / zero normals outside the mask)'
complete -c moge -n "__fish_moge_using_subcommand bench" -l no-force-projection -d 'Keep the predicted x, y instead of re-projecting the depth through the intrinsics'
complete -c moge -n "__fish_moge_using_subcommand bench" -l per-step -d 'MoGe-3: also keep each refine step\'s maps, in the npz as upstream\'s `points_per_step`, `depth_per_step`, `intrinsics_per_step` (and `mask_per_step`), step 0 unrefined'
complete -c moge -n "__fish_moge_using_subcommand bench" -l json -d 'Print one JSON object instead of the table'
complete -c moge -n "__fish_moge_using_subcommand bench" -l host-only -d 'Time only the host stages (decode, prepare, postprocess, write --format) with one forward\'s output reused: what the host costs per image next to a fast device'
complete -c moge -n "__fish_moge_using_subcommand bench" -l no-compress -d 'Same as --npz-compression none'
complete -c moge -n "__fish_moge_using_subcommand bench" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c moge -n "__fish_moge_using_subcommand compare" -l min-pcc -d 'Lowest PCC of points, depth and normal over the pixels valid in both' -r
complete -c moge -n "__fish_moge_using_subcommand compare" -l max-depth-rel-median -d 'Largest median of |depth_B - depth_A| / depth_A' -r
complete -c moge -n "__fish_moge_using_subcommand compare" -l max-depth-rel -d 'Largest |depth_B - depth_A| / depth_A at any pixel' -r
complete -c moge -n "__fish_moge_using_subcommand compare" -l min-mask-iou -d 'Lowest intersection over union of the validity masks' -r
complete -c moge -n "__fish_moge_using_subcommand compare" -l max-fov-diff -d 'Largest difference of fov_x or fov_y, degrees' -r
complete -c moge -n "__fish_moge_using_subcommand compare" -l max-scale-diff -d 'Largest difference of the metric scales, as max(r, 1/r) - 1 of their ratio r' -r
complete -c moge -n "__fish_moge_using_subcommand compare" -l json -d 'Print one JSON object: each photo\'s figures, the worst, the gates and what failed them'
complete -c moge -n "__fish_moge_using_subcommand compare" -s h -l help -d 'Print help'
complete -c moge -n "__fish_moge_using_subcommand quantize" -l weights -d 'A local checkpoint: upstream model.pt, or .safetensors with its JSON config beside it' -r -F
complete -c moge -n "__fish_moge_using_subcommand quantize" -l model -d 'A published model, fetched from the Hugging Face hub on first use' -r -f -a "vits-normal\t''
vitb-normal\t''
vitl-normal\t''
vitl\t''
moge3-vitl\t''
moge3-vitg\t''"
complete -c moge -n "__fish_moge_using_subcommand quantize" -l revision -d 'Branch, tag or commit of the published model\'s repo' -r
complete -c moge -n "__fish_moge_using_subcommand quantize" -s o -l output -d 'The int8 checkpoint to write (.safetensors; its config is written beside it as .json)' -r -F
complete -c moge -n "__fish_moge_using_subcommand quantize" -s h -l help -d 'Print help'
complete -c moge -n "__fish_moge_using_subcommand download" -l model -d 'A published model to fetch; repeat for several [default: vitl-normal]' -r -f -a "vits-normal\t''
vitb-normal\t''
vitl-normal\t''
vitl\t''
moge3-vitl\t''
moge3-vitg\t''"
complete -c moge -n "__fish_moge_using_subcommand download" -l revision -d 'Branch, tag or commit of the model repos' -r
complete -c moge -n "__fish_moge_using_subcommand download" -s h -l help -d 'Print help'
complete -c moge -n "__fish_moge_using_subcommand info" -l revision -d 'Branch, tag or commit to look up in the cache' -r
complete -c moge -n "__fish_moge_using_subcommand info" -l json -d 'Print a JSON list of the models: name, repo, revision, cached, path, size, sha256, commit, repo_dir'
complete -c moge -n "__fish_moge_using_subcommand info" -l verify -d 'Re-hash every cached file and compare with the sha256 it is stored under (reads them all)'
complete -c moge -n "__fish_moge_using_subcommand info" -s h -l help -d 'Print help'
complete -c moge -n "__fish_moge_using_subcommand models" -l revision -d 'Branch, tag or commit to look up in the cache' -r
complete -c moge -n "__fish_moge_using_subcommand models" -l json -d 'Print a JSON list of the models: name, repo, revision, cached, path, size, sha256, commit, repo_dir'
complete -c moge -n "__fish_moge_using_subcommand models" -l verify -d 'Re-hash every cached file and compare with the sha256 it is stored under (reads them all)'
complete -c moge -n "__fish_moge_using_subcommand models" -s h -l help -d 'Print help'
complete -c moge -n "__fish_moge_using_subcommand generate-assets" -s h -l help -d 'Print help'
complete -c moge -n "__fish_moge_using_subcommand help; and not __fish_seen_subcommand_from predict batch panorama colmap serve bench compare quantize download info generate-assets help" -f -a "predict" -d 'Predict geometry for image files'
complete -c moge -n "__fish_moge_using_subcommand help; and not __fish_seen_subcommand_from predict batch panorama colmap serve bench compare quantize download info generate-assets help" -f -a "batch" -d 'Predict geometry for every photo under directories, streaming, outputs in a mirrored tree'
complete -c moge -n "__fish_moge_using_subcommand help; and not __fish_seen_subcommand_from predict batch panorama colmap serve bench compare quantize download info generate-assets help" -f -a "panorama" -d '360° equirectangular panoramas: twelve views through the model, merged into one metric distance map'
complete -c moge -n "__fish_moge_using_subcommand help; and not __fish_seen_subcommand_from predict batch panorama colmap serve bench compare quantize download info generate-assets help" -f -a "colmap" -d 'Depth for every image of a COLMAP reconstruction, with its camera, at the reconstruction\'s scale (depth priors for Gaussian splatting and NeRF)'
complete -c moge -n "__fish_moge_using_subcommand help; and not __fish_seen_subcommand_from predict batch panorama colmap serve bench compare quantize download info generate-assets help" -f -a "serve" -d 'Keep the model loaded and answer HTTP requests with the API of the Tenstorrent MoGe-2 server (tt-MoGe)'
complete -c moge -n "__fish_moge_using_subcommand help; and not __fish_seen_subcommand_from predict batch panorama colmap serve bench compare quantize download info generate-assets help" -f -a "bench" -d 'Time the model: cold start, warm per-image time, stages, peak memory'
complete -c moge -n "__fish_moge_using_subcommand help; and not __fish_seen_subcommand_from predict batch panorama colmap serve bench compare quantize download info generate-assets help" -f -a "compare" -d 'How far the predictions in B are from those in A (npz files or output directories): PCC, depth error, mask IoU, fov, scale'
complete -c moge -n "__fish_moge_using_subcommand help; and not __fish_seen_subcommand_from predict batch panorama colmap serve bench compare quantize download info generate-assets help" -f -a "quantize" -d 'Store a checkpoint\'s weights in int8 (a scale per channel), a quarter of the size, for --precision int8'
complete -c moge -n "__fish_moge_using_subcommand help; and not __fish_seen_subcommand_from predict batch panorama colmap serve bench compare quantize download info generate-assets help" -f -a "download" -d 'Fetch published models into the Hugging Face cache ahead of time'
complete -c moge -n "__fish_moge_using_subcommand help; and not __fish_seen_subcommand_from predict batch panorama colmap serve bench compare quantize download info generate-assets help" -f -a "info" -d 'List the published models: which are cached, where, their size and sha256'
complete -c moge -n "__fish_moge_using_subcommand help; and not __fish_seen_subcommand_from predict batch panorama colmap serve bench compare quantize download info generate-assets help" -f -a "generate-assets" -d 'Write the man pages and shell completions (for packagers)'
complete -c moge -n "__fish_moge_using_subcommand help; and not __fish_seen_subcommand_from predict batch panorama colmap serve bench compare quantize download info generate-assets help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
