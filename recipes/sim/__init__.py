"""The simulated trainer: prints the log a NeMo 2 run would print, from figures the controller computed."""
