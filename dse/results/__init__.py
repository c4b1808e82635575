"""Finished studies read back: the HTML report (``report``), the comparison of studies (``compare``), a study as an
Optuna study (``export``) and as a Minari dataset (``offline``). Nothing here runs a trial or writes into a study.
"""
