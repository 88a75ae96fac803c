#!/bin/sh
# Build one image carrying SandboxFusion's common toolchains the host lacks (go, rust, php,
# nodejs + typescript, plus python3, bash, gcc/g++) and import it into this node's store, for
# the SandboxFusion face's per-language images:
#
#   sudo scripts/build_lang_image.sh tangram.toml sf-langs:1
#   # then, in tangram.toml:
#   # [sandboxfusion]
#   # language_images = { go = "sf-langs:1", rust = "sf-langs:1", php = "sf-langs:1", typescript = "sf-langs:1", nodejs = "sf-langs:1" }
#
# It DOWNLOADS from Debian's mirror (mmdebstrap), so it is run by hand, never by the tests or
# CI. Needs root (the store is 0700 root), mmdebstrap, and no server using the store while it
# imports (the CLI works on the store in its own process). A bare reference such as
# sf-langs:1 needs [images] default_registry; otherwise name it HOST/NAME:TAG.
set -eu
config=${1:?usage: build_lang_image.sh CONFIG REFERENCE [SUITE]}
reference=${2:?usage: build_lang_image.sh CONFIG REFERENCE [SUITE]}
suite=${3:-bookworm}
packages=golang-go,rustc,php-cli,nodejs,node-typescript,python3,gcc,g++,findutils,ca-certificates
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# findutils: the face's pool resets a sandbox with find before reusing it
mmdebstrap --variant=apt --include="$packages" "$suite" "$work/rootfs.tar"
arl-tangram image import "$work/rootfs.tar" --reference "$reference" --config "$config"
echo "imported $reference; toolchains: $(echo "$packages" | tr , ' ')"
