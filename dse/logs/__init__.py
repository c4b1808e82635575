"""What a run wrote: its log parsed into metrics and a failure class (``parse``), the early-stop and pruning rules
read from it as it grows (``steady``), and logs packed into a study's archive (``logpack``).
"""
