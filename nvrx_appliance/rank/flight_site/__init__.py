"""The directory a rank's guard puts first on its workload's PYTHONPATH (rank/flight.py):
it holds only sitecustomize.py, the flight-recorder watch every workload's Python runs."""
