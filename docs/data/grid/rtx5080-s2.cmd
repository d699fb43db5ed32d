/work/main/build/autocompress run --config /work/main/configs/experiments/rtx5080.cfg --seed 2 --out runs/grid/rtx5080-s2
