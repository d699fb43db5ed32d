/work/main/build/autocompress run --config /work/main/configs/experiments/h100.cfg --seed 1 --out runs/grid/h100-s1
