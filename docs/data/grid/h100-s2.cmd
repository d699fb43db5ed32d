/work/main/build/autocompress run --config /work/main/configs/experiments/h100.cfg --seed 2 --out runs/grid/h100-s2
