"""impala_lab_grader: the instructors' batch grader for impala_lab's exercises.

``python -m impala_lab_grader HAND-IN.ipynb ...`` grades handed-in exercise notebooks, each in
a bubblewrap sandbox that holds only a student's world, with every verdict decided by the
grader (`impala_lab_grader.grade`); ``python -m impala_lab_grader export --nbgrader DIR``
writes nbgrader source notebooks (`impala_lab_grader.nbgrader_export`). The threat model,
what the grader guarantees and the instructors' workflows are in docs/grading.md.

Importing this package imports nothing: the grading child imports it inside the sandbox.
"""
