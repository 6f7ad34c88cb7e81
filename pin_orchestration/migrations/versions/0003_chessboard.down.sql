-- Migration 0003 down: back to 0002.

DROP SCHEMA chessboard CASCADE;
