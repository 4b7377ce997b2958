import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests/required.py
sys.path.insert(0, str(HERE.parent / "telemetry"))  # otlp_receiver.py
sys.path.insert(0, str(HERE.parent / "e2e"))  # e2e_servers.py
