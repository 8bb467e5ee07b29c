"""Why are GPU pods rejected or failing? Admission errors and the races behind them
(admission_race.py, plugin_messages.py), containers the runtime cannot create or start
(container_start.py, start_frames.py, runtime.py), a Ready node that rejects every GPU pod sent to
it (black_hole.py), and one pod's reason in one finding (pod_status.py).
"""
