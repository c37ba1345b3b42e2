"""The batch grader is the instructors' package ``impala_lab_grader`` now (docs/grading.md)."""

import sys

sys.exit("error: the grader is the instructors' package now: python -m impala_lab_grader "
         "NOTEBOOK.ipynb ... (pip install -e ./grader in a clone; see docs/grading.md)")
