"""The course layer: one folder per lesson (lNN_name/: its graders and solutions, its views, its
runs, its recorded data), which the library never imports. `smallem.exercises.load_lessons`
imports every lNN_name folder here, and importing one registers its exercises."""
