#!/usr/bin/env python3
"""A folder (or bucket) of photos through MoGe on Ray Data: one model per actor, an npz per photo
(`moge predict`'s), and a Parquet table of what each photo gave (path, npz, fov, metric scale,
error).

    python examples/python/ray_batch.py PHOTOS OUT [--model vitl-normal] [--actors 2] [--cpus-per-actor 1]

PHOTOS is anything `ray.data.read_binary_files` reads (a folder, `s3://...`); OUT a folder every
actor can write. Against a running cluster, set RAY_ADDRESS; without it Ray starts one here.
"""

import argparse

import ray

from moge_rs.ray import MoGePredictor


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("photos")
    ap.add_argument("out")
    ap.add_argument("--model", default="vitl-normal", help="a published name or a checkpoint path")
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--cpus-per-actor", type=int, default=1, help="each actor's forwards use this many threads")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--precision", default="auto")
    args = ap.parse_args()

    ray.init(include_dashboard=False)
    # Reading takes no CPU of those the actors hold.
    photos = ray.data.read_binary_files(args.photos, include_paths=True, num_cpus=0)
    results = photos.map_batches(
        MoGePredictor,
        fn_constructor_kwargs={"model": args.model, "precision": args.precision, "output_dir": args.out, "relative_to": args.photos},
        compute=ray.data.ActorPoolStrategy(size=args.actors),
        num_cpus=args.cpus_per_actor,
        batch_size=args.batch_size,
    )
    results.write_parquet(f"{args.out}/summary")
    table = ray.data.read_parquet(f"{args.out}/summary")
    failed = table.filter(lambda r: r["error"] is not None).take_all()
    print(f"{table.count()} photos, {len(failed)} failed; npz files and summary/ in {args.out}")
    for r in failed:
        print(f"  {r['error']}")
    ray.shutdown()
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
