"""``mmdtl2 ingest``: convert feature files into a feature store.

Examples
--------
Two devices sharing the conv3 space, labels inside the ``.mat`` files::

    mmdtl2 ingest study.zarr -i olympus:conv3:olympus_conv3.mat -i fuji:conv3:fuji.mat

A ``.npy`` with a side table of labels / groups / ids (csv or parquet)::

    mmdtl2 ingest study.zarr -i cam_a:conv3:a.npy --metadata cam_a:a_meta.csv
"""

from __future__ import annotations

import argparse

from mmdtl2_dist.commands import add_store_output_options, progress_choice
from mmdtl2_dist.store.ingest import FORMATS, IngestInput, ingest

#: What a Ctrl-C leaves (printed by the CLI).
INTERRUPTED = (
    "nothing was written (a store is put in place only when complete); run the command again."
)


def _split_input(text: str) -> tuple[str, str, str]:
    parts = text.split(":", 2)
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"-i expects DEVICE:SPACE:PATH, got {text!r}.")
    return parts[0], parts[1], parts[2]


def run(args: argparse.Namespace) -> int:
    keys = {
        "label": args.labels_key,
        "class_name": args.class_names_key,
        "group": args.groups_key,
        "sample_id": args.ids_key,
    }
    keys = {k: v for k, v in keys.items() if v}
    side = {}
    for text in args.metadata or []:
        device, sep, path = text.partition(":")
        if not sep or not path:
            raise ValueError(f"--metadata expects DEVICE:PATH, got {text!r}.")
        side[device] = path
    inputs = []
    for text in args.input:
        device, space, path = _split_input(text)
        inputs.append(
            IngestInput(
                device,
                space,
                path,
                features_key=args.features_key,
                keys=keys,
                metadata_path=side.get(device),
                transpose=args.transpose,
                header=args.header,
                index=args.index,
            )
        )
    unknown = set(side) - {i.device for i in inputs}
    if unknown:
        raise ValueError(f"--metadata for device(s) {sorted(unknown)} without an input (-i).")
    fs = ingest(
        args.store,
        inputs,
        overwrite=args.overwrite,
        compression=args.compression,
        chunk_rows=args.chunk_rows,
        dtype=args.dtype,
        progress=progress_choice(args),
    )
    if not args.quiet:
        print(f"{fs}\nfingerprint {fs.fingerprint}")
        for line in labelled_counts(fs):
            print(line)
    return 0


def labelled_counts(fs) -> list[str]:
    """Per device: samples, labelled samples and classes; a device without labels named.

    A device's samples are the rows of one of its spaces (every space holds them all).
    """
    import numpy as np

    meta, out = fs.metadata, []
    for device in fs.devices:
        rows = meta[meta["device"] == device]
        y = rows.loc[rows["space"] == rows["space"].iloc[0], "label"].to_numpy()  # one space
        lab = y[y >= 0]
        line = f"{device}: {len(y)} samples, {len(lab)} labelled ({len(np.unique(lab))} classes)"
        if not len(lab):
            line += (
                "; no label column or variable was found (or every label is -1): pass "
                "--labels-key NAME if it has labels"
            )
        out.append(line)
    return out


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ingest",
        help="convert feature files (npy/npz/mat/csv/parquet) into a feature store",
        description=(
            f"Build a feature store (Zarr arrays + Parquet metadata) from {', '.join(FORMATS)} "
            "files, atomically: a failed ingest leaves nothing behind. Refuses NaN/Inf."
        ),
        epilog=(
            "examples:\n  mmdtl2 ingest study.zarr -i olympus:conv3:a.mat -i fuji:conv3:b.mat\n"
            "  mmdtl2 ingest study.zarr -i cam_a:conv3:a.npy --metadata cam_a:a_meta.csv"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", help="directory of the feature store to create")
    p.add_argument(
        "-i",
        "--input",
        action="append",
        required=True,
        metavar="DEVICE:SPACE:PATH",
        help="features of DEVICE in feature space SPACE (repeat)",
    )
    p.add_argument(
        "--metadata",
        action="append",
        metavar="DEVICE:PATH",
        help="side table (csv/parquet) with label, class_name, group, sample_id",
    )
    p.add_argument(
        "--features-key",
        help="variable / list column holding the features, in every input (default: found)",
    )
    p.add_argument(
        "--labels-key", help="variable / column of integer labels, in every input (default: found)"
    )
    p.add_argument("--class-names-key", help="variable / column of class names")
    p.add_argument("--groups-key", help="variable / column of groups (patient, video)")
    p.add_argument("--ids-key", help="variable / column of original sample ids")
    p.add_argument("--transpose", action="store_true", help="features are stored L x n")
    p.add_argument(
        "--header",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="CSV: the first row names the columns (--header) or is a sample (--no-header); "
        "default: a first row of numbers is a sample",
    )
    p.add_argument(
        "--index",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="CSV: the first column is a row index, dropped (--index, what pandas' to_csv "
        "writes by default) or a feature (--no-index); default: refuse a first column "
        "that looks like pandas' index",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "float64"],
        help="force the stored dtype (default keeps float32/float64)",
    )
    p.add_argument("--chunk-rows", type=int, help="rows per chunk (default 256, >= 1 MB)")
    add_store_output_options(p)
    p.set_defaults(func=run, interrupted=INTERRUPTED)
