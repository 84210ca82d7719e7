"""Apps served by the peers' own environments (bench/.peers/), never imported by the harness."""
