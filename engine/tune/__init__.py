"""Tools over the runner: calibration, the latency model, bench, evaluation."""
