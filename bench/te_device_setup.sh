#!/usr/bin/env bash
# Install Transformer Engine 2.20.2 (and, given a second folder, the controller's own dependencies) on the device
# machine (Python 3.12, torch 2.11+cu130, nvcc 13), into /tmp/site, from what earlier calls staged in STAGE:
#   calls 1-5: each carries .te/pN (.te/p1-.te/p4: 58 MB parts of the 276 MB transformer_engine_cu13-2.20.2 wheel,
#              `split -b 58M`; .te/p5: the last part, whl/ = megatron-core, transformer-engine, importlib-metadata,
#              nvdlfw-inspect, nvidia-cudnn-frontend; src/ = transformer_engine_torch-2.20.2.tar.gz),
#              command: mkdir -p /tmp/te && cp -r .te/pN/. /tmp/te/
#   call 6:    carries .whl (the controller's wheels the device image lacks: nemo-run 0.11.1, leptonai 0.27.3,
#              optuna, gymnasium, pydantic, plotly and their own), command: bash bench/te_device_setup.sh /tmp/te .whl
# The machine must stay warm between the calls (it is given back after 30 s idle). Prints each step's seconds.
set -eu
stage=$1
extra=${2:-}
t() { date +%s.%N; }
s0=$(t)
whl=$stage/transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl
cat "$stage"/te.part* > "$whl"
rm "$stage"/te.part*
md5sum "$whl"
s1=$(t)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$whl" "$stage"/whl/*.whl ${extra:+"$extra"/*.whl}
s2=$(t)
export PYTHONPATH=/tmp/site
NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_CUDA_ARCHS=90 MAX_JOBS=16 python3 -m pip install -q --no-index --no-deps \
  --no-build-isolation --no-cache-dir --target /tmp/site-tt "$stage"/src/transformer_engine_torch-2.20.2.tar.gz
cp -r /tmp/site-tt/* /tmp/site/
s3=$(t)
python3 -c "import transformer_engine.pytorch as te, transformer_engine; print('TE', transformer_engine.__version__)"
s4=$(t)
python3 -c "print('join %.1f s, install wheels %.1f s, build transformer-engine-torch %.1f s, import %.1f s' % ($s1-$s0, $s2-$s1, $s3-$s2, $s4-$s3))"
