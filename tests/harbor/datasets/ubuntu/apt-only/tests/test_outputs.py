import os
from pathlib import Path


def test_answer():
    assert Path("/app/answer.txt").read_text() == "UBUNTU\n"


def test_image():
    """The root filesystem is Ubuntu 24.04 from Ubuntu's archive, with the Dockerfile's ENV."""
    release = Path("/etc/os-release").read_text()
    assert "ID=ubuntu" in release and 'VERSION_ID="24.04"' in release
    assert os.environ.get("TASK_GREETING") == "hello"
