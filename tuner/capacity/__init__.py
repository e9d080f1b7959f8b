"""`tuner capacity`: how many closed-loop users a config serves within the study's SLO.

`levels.py` (a level's figures and verdict, a sweep's capacity; pure), `shapes.py` (what the users ask),
`closed_loop.py` (the users against a server), `record.py` (the sweep as the run directory stores it),
`sweep.py` (the rounds over configs and levels on a target), `simulated.py` (the target on the simulated
server's own clock), `command.py` (the command's plan and entry).
"""
