-- Daily notes: read today's note, and append a line to it (made from a template when missing).
-- Settings ([plugins.daily] in config.toml): folder, format (os.date), template ({{date}}).
local settings = { folder = "Daily", format = "%Y-%m-%d", template = "# {{date}}\n\n## Log\n" }

local function today_path()
  local date = os.date(settings.format)
  return settings.folder .. "/" .. date .. ".md", date
end

local function render(date)
  return (settings.template:gsub("{{date}}", date))
end

return {
  name = "daily",
  setup = function(cfg)
    for key, value in pairs(cfg) do
      if settings[key] == nil then
        error("unknown setting '" .. key .. "' (daily knows folder, format, template)")
      end
      settings[key] = value
    end
  end,
  tools = {
    today = {
      desc = "Today's daily note: its path and text, or the template it would start from.",
      read_only = true,
      params = {},
      fn = function()
        local path, date = today_path()
        if crucible.note_exists(path) then
          return { path = path, exists = true, content = crucible.read_note(path).content }
        end
        return { path = path, exists = false, content = render(date) }
      end,
    },
    append_to_today = {
      desc = "Append a line to today's daily note (created from the template when it does not exist).",
      params = {
        { name = "text", type = "string", desc = "what to add" },
        { name = "time", type = "boolean", desc = "start the line with the time (default true)", optional = true },
      },
      fn = function(args)
        local path, date = today_path()
        local content, hash = render(date), nil
        if crucible.note_exists(path) then
          local note = crucible.read_note(path)
          content, hash = note.content, note.content_hash
        end
        if content:sub(-1) ~= "\n" then content = content .. "\n" end
        local line = "- " .. (args.time == false and "" or os.date("%H:%M") .. " ") .. args.text
        local written = crucible.write_note(path, content .. line .. "\n", hash)
        return { path = path, action = written.action, added = line }
      end,
    },
  },
}
