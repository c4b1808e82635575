#!/usr/bin/env bash
# Install Transformer Engine 2.20.2 on the device machine (Python 3.12, torch 2.11+cu130, nvcc 13), into
# /tmp/site, from what earlier calls left in /tmp/te and what this call carries:
#   calls 1-4: carry DIR/p1 .. DIR/p4 (split -b 56M parts of transformer_engine_cu13-2.20.2 wheel, 276 MB),
#              command: mkdir -p /tmp/te && cp DIR/pN/* /tmp/te/
#   call 5:    carry DIR/p5 DIR/whl (megatron-core, transformer-engine, pydantic + its three, importlib-metadata,
#              nvdlfw-inspect, nvidia-cudnn-frontend) DIR/src (transformer_engine_torch-2.20.2.tar.gz),
#              command: bash bench/te_device_setup.sh DIR
# The machine must stay warm between the calls (it is given back after 30 s idle). Prints each step's seconds.
set -eu
dir=$1
t() { date +%s.%N; }
s0=$(t)
cp "$dir"/p5/* /tmp/te/
cat /tmp/te/te.part* > /tmp/te/transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl
rm /tmp/te/te.part*
md5sum /tmp/te/*.whl
s1=$(t)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  /tmp/te/*.whl "$dir"/whl/*.whl
s2=$(t)
export PYTHONPATH=/tmp/site
NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_CUDA_ARCHS=90 MAX_JOBS=16 python3 -m pip install -q --no-index --no-deps \
  --no-build-isolation --no-cache-dir --target /tmp/site-tt "$dir"/src/transformer_engine_torch-2.20.2.tar.gz
cp -r /tmp/site-tt/* /tmp/site/
s3=$(t)
python3 -c "import transformer_engine.pytorch as te, transformer_engine; print('TE', transformer_engine.__version__)"
s4=$(t)
python3 -c "print('join %.1f s, install wheels %.1f s, build transformer-engine-torch %.1f s, import %.1f s' % ($s1-$s0, $s2-$s1, $s3-$s2, $s4-$s3))"
