-- window.lua: what fixed_window.lua and sliding_window_counter.lua share;
-- sent after prelude.lua and before either of them (see limiter/algorithm.go).

-- The aligned window t falls in, ⌊t/W⌋, as limiter/fixed_window.go computes it.
local function index(t)
  if t < 0 then
    return 0
  end
  return floor(t / w)
end
