"""Pipeline stages (collect, index, coldstart, distill, evaluate) and their building blocks."""
