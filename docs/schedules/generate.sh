#!/bin/sh
# Regenerates the pictures in this folder (run from the repository root after `npm run build`).
# PNGs need a headless Chromium (set CHROMIUM to its path if it is not /usr/bin/chromium) or,
# failing that, rsvg-convert (Debian: librsvg2-bin).
set -e
out=docs/schedules
cli="node bin/sapipe.js schedule"
$cli gpipe --stages 4 --microbatches 8 --svg $out/gpipe.svg
$cli 1f1b --stages 4 --microbatches 8 --svg $out/1f1b.svg
$cli interleaved-1f1b --stages 4 --microbatches 8 --virtual-stages 2 --svg $out/interleaved-1f1b.svg
$cli pipedream --stages 4 --microbatches 8 --svg $out/pipedream.svg
$cli pipedream-2bw --stages 4 --microbatches 4 --iterations 3 --svg $out/pipedream-2bw.svg
$cli pipeoptim --stages 4 --microbatches 8 --svg $out/pipeoptim.svg
$cli spectrain --stages 4 --microbatches 8 --svg $out/spectrain.svg
$cli avgpipe --stages 4 --microbatches 8 --pipelines 2 --advance 3 --latency 1 --svg $out/avgpipe.svg
$cli wavelet --stages 4 --microbatches 4 --allreduce 1 --svg $out/wavelet.svg
$cli wavelet --stages 4 --microbatches 8 --form model-parallel --allreduce 1 --svg $out/wavelet-model-parallel.svg
$cli pipelined-backprop --stages 4 --microbatches 8 --svg $out/pipelined-backprop.svg
$cli sapipe --stages 4 --microbatches 6 --allreduce 2.5 --svg $out/sapipe.svg
$cli zb-h1 --stages 4 --microbatches 8 --svg $out/zb-h1.svg
chromium=${CHROMIUM:-/usr/bin/chromium}
if [ -x "$chromium" ]; then
  for svg in $out/*.svg; do
    size=$(sed -n 's/^<svg [^>]*width="\([0-9]*\)" height="\([0-9]*\)".*/\1,\2/p' "$svg")
    "$chromium" --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
      --disable-sync --no-first-run --hide-scrollbars --window-size="$size" --screenshot="${svg%.svg}.png" "file://$PWD/$svg" 2>/dev/null
  done
elif command -v rsvg-convert >/dev/null; then
  for svg in $out/*.svg; do rsvg-convert "$svg" -o "${svg%.svg}.png"; done
fi
