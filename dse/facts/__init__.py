"""What dse knows before any space is read: the knob catalogue (``knobs``), the one table of GPU facts
(``hardware``), the container families (``containers``), the allowlists of what may reach a launch
(``allowlists``) and the calibration file, fitted values of the model's parameters (``calibration_file``).
Facts import nothing of dse above them; the rules, the model and everything else read them.
"""
