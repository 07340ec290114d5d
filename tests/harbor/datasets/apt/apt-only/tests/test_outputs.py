import os
from pathlib import Path


def test_answer():
    assert Path("/app/answer.txt").read_text() == "DRESSAGE\n"


def test_image():
    assert Path("/etc/motd-task").read_text().startswith("from the task")
    assert os.environ.get("TASK_GREETING") == "bonjour"
