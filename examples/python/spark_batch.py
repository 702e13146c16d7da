#!/usr/bin/env python3
"""Photos through MoGe on Spark with predict_batch_udf: one model per Python worker, an npz per
photo (`moge predict`'s), and a Parquet table of what each photo gave.

    python examples/python/spark_batch.py PHOTOS OUT [--model vitl-normal] [--master local[2]]

PHOTOS is a folder (or glob) Spark's `binaryFile` source reads; OUT a folder every executor can
write. On a cluster, run it with spark-submit and leave --master out.
"""

import argparse
import os

from pyspark.sql import SparkSession

from moge_rs.spark import predict_udf


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("photos")
    ap.add_argument("out")
    ap.add_argument("--model", default="vitl-normal", help="a published name or a checkpoint path")
    ap.add_argument("--master", default=None)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--precision", default="auto")
    args = ap.parse_args()

    builder = SparkSession.builder.appName("moge")
    if args.master:
        builder = builder.master(args.master).config("spark.ui.enabled", "false")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    photos = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(args.photos)
    moge = predict_udf(args.model, input="bytes", outputs=(), output_dir=args.out, relative_to=args.photos, precision=args.precision, batch_size=args.batch_size)
    table = photos.select("path", moge("content", "path").alias("moge")).select("path", "moge.*")
    table.write.mode("overwrite").parquet(os.path.join(args.out, "summary"))
    summary = spark.read.parquet(os.path.join(args.out, "summary"))
    failed = summary.filter(summary.error != "").collect()
    print(f"{summary.count()} photos, {len(failed)} failed; npz files and summary/ in {args.out}")
    for r in failed:
        print(f"  {r['error']}")
    spark.stop()
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
