"""Light and dark palettes and the app's style sheet; the scheme follows the OS or the user.

Qt 6.5+ reports the system colour scheme (`QStyleHints.colorScheme`) and signals changes; the
app uses Fusion everywhere so both schemes look the same on every platform, and keeps its few
colours here rather than scattered through the widgets. The user's choice
(`AppSettings.theme`: system, light or dark) picks the palette:

    apply_theme(app, palette_for(settings.theme, app))   # "system": whatever the OS says now
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.qt import Qt, QtCore, QtGui, QtWidgets
from runtime.atomic_file import write_bytes
from runtime.paths import user_dirs


@dataclass(frozen=True)
class Palette:
    name: str
    window: str
    surface: str  # cards, inputs
    sidebar: str
    text: str
    muted: str
    border: str
    accent: str
    accent_text: str
    user_bubble: str
    code_bg: str
    code_header: str
    code_style: str  # pygments style
    draft_bg: str  # accepted draft tokens
    error_bg: str
    error_text: str
    ok: str
    warn: str
    plot: tuple[str, ...]  # series colours


LIGHT = Palette(
    name="light", window="#f6f7f9", surface="#ffffff", sidebar="#eef0f4", text="#1f2328",
    muted="#6b7280", border="#dde1e7", accent="#3b6fd8", accent_text="#ffffff",
    user_bubble="#e8effc", code_bg="#f3f4f7", code_header="#e7e9ee", code_style="default",
    draft_bg="#d6f5df", error_bg="#fdecec", error_text="#a3262a", ok="#2f9e5b",
    warn="#c77c0e", plot=("#3b6fd8", "#e07b39", "#2f9e5b", "#a35ad8"),
)

DARK = Palette(
    name="dark", window="#17191d", surface="#1f2227", sidebar="#1b1d22", text="#e6e8eb",
    muted="#9aa1ab", border="#30343b", accent="#6b96f0", accent_text="#0d1117",
    user_bubble="#26324a", code_bg="#16181c", code_header="#23262c", code_style="one-dark",
    draft_bg="#1f4a2f", error_bg="#4a1f22", error_text="#ffb4b4", ok="#4cc27d",
    warn="#e5a54b", plot=("#6b96f0", "#f0955b", "#4cc27d", "#c18af0"),
)


def system_palette(app: QtWidgets.QApplication) -> Palette:
    scheme = app.styleHints().colorScheme()
    return DARK if scheme == Qt.ColorScheme.Dark else LIGHT


def palette_for(theme: str, app: QtWidgets.QApplication) -> Palette:
    """The palette for a theme setting: "light", "dark", or "system" (the OS scheme now)."""
    if theme == "light":
        return LIGHT
    if theme == "dark":
        return DARK
    return system_palette(app)


def qpalette(p: Palette) -> QtGui.QPalette:
    pal = QtGui.QPalette()
    c = QtGui.QColor
    role = QtGui.QPalette.ColorRole
    pal.setColor(role.Window, c(p.window))
    pal.setColor(role.WindowText, c(p.text))
    pal.setColor(role.Base, c(p.surface))
    pal.setColor(role.AlternateBase, c(p.sidebar))
    pal.setColor(role.Text, c(p.text))
    pal.setColor(role.Button, c(p.surface))
    pal.setColor(role.ButtonText, c(p.text))
    pal.setColor(role.Highlight, c(p.accent))
    pal.setColor(role.HighlightedText, c(p.accent_text))
    pal.setColor(role.ToolTipBase, c(p.surface))
    pal.setColor(role.ToolTipText, c(p.text))
    pal.setColor(role.PlaceholderText, c(p.muted))
    pal.setColor(role.Link, c(p.accent))
    pal.setColor(QtGui.QPalette.ColorGroup.Disabled, role.Text, c(p.muted))
    pal.setColor(QtGui.QPalette.ColorGroup.Disabled, role.ButtonText, c(p.muted))
    pal.setColor(QtGui.QPalette.ColorGroup.Disabled, role.WindowText, c(p.muted))
    return pal


def style_sheet(p: Palette) -> str:
    return f"""
    QWidget {{ font-size: 10pt; }}
    QMainWindow, QStackedWidget > QWidget {{ background: {p.window}; }}
    #sidebar {{ background: {p.sidebar}; border: none; border-right: 1px solid {p.border};
               padding-top: 8px; outline: 0; }}
    #sidebar::item {{ padding: 9px 14px; margin: 2px 8px; border-radius: 6px; color: {p.text}; }}
    #sidebar::item:selected {{ background: {p.accent}; color: {p.accent_text}; }}
    #sidebar::item:hover:!selected {{ background: {p.border}; }}
    #brand {{ font-size: 13pt; font-weight: 600; padding: 14px 16px 6px 16px; color: {p.text};
             background: {p.sidebar}; border-right: 1px solid {p.border}; }}
    #conversationPane {{ background: {p.surface}; border-right: 1px solid {p.border}; }}
    #conversationList {{ background: {p.surface}; border: none; outline: 0; }}
    #conversationList::item {{ padding: 7px 10px; margin: 1px 6px; border-radius: 6px; }}
    #conversationList::item:selected {{ background: {p.user_bubble}; color: {p.text}; }}
    #chatHeader {{ background: {p.surface}; border-bottom: 1px solid {p.border}; }}
    #pageTitle {{ font-size: 14pt; font-weight: 600; }}
    #welcomeTitle {{ font-size: 20pt; font-weight: 600; }}
    #muted, QLabel[muted="true"] {{ color: {p.muted}; }}
    #errorText {{ color: {p.error_text}; }}
    #transcript, #transcriptInner {{ background: {p.window}; border: none; }}
    #bubble {{ background: {p.surface}; border: 1px solid {p.border}; border-radius: 10px; }}
    #bubble[role="user"] {{ background: {p.user_bubble}; border-color: {p.user_bubble}; }}
    #bubbleBody {{ background: transparent; border: none; }}
    #roleLabel {{ font-weight: 600; }}
    #footer {{ color: {p.muted}; font-size: 9pt; }}
    #replyError {{ background: {p.error_bg}; color: {p.error_text}; border-radius: 6px;
                   padding: 6px 10px; }}
    #composer {{ background: {p.surface}; border: 1px solid {p.border}; border-radius: 10px;
                 padding: 6px; }}
    #composerBar {{ background: {p.window}; }}
    #attachmentChip {{ background: {p.window}; border: 1px solid {p.border}; border-radius: 6px; }}
    #bubble #attachmentChip {{ background: {p.surface}; }}
    #passagesButton {{ padding: 0; font-size: 9pt; }}
    #editBanner {{ color: {p.accent}; }}
    QPushButton {{ padding: 5px 12px; border-radius: 6px; border: 1px solid {p.border};
                   background: {p.surface}; }}
    QPushButton:hover {{ border-color: {p.accent}; }}
    QPushButton:disabled {{ color: {p.muted}; }}
    QPushButton#primary {{ background: {p.accent}; color: {p.accent_text}; border-color: {p.accent}; }}
    QPushButton#primary:disabled {{ background: {p.border}; border-color: {p.border}; color: {p.muted}; }}
    QToolButton {{ border: none; padding: 3px 6px; border-radius: 5px; color: {p.muted}; }}
    QToolButton:hover {{ background: {p.border}; color: {p.text}; }}
    QToolButton:checked {{ background: {p.user_bubble}; color: {p.text}; }}
    QToolButton::menu-indicator {{ image: none; width: 0; }}
    QLineEdit, QPlainTextEdit, QTextEdit, QComboBox, QSpinBox, QDoubleSpinBox {{
        border: 1px solid {p.border}; border-radius: 6px; padding: 4px 6px; background: {p.surface}; }}
    QLineEdit:focus, QPlainTextEdit:focus, QComboBox:focus {{ border-color: {p.accent}; }}
    QComboBox::drop-down {{ border: none; width: 18px; }}
    /* A styled combo box draws no arrow of its own, and a triangle made of borders comes out
       as a bar in Qt's style sheets: a small drawn image in the theme's colour (down_arrow). */
    QComboBox::down-arrow {{ image: url("{down_arrow(p.muted)}"); width: 9px; height: 5px; }}
    QComboBox::down-arrow:disabled {{ image: url("{down_arrow(p.border)}"); }}
    /* Fusion outlines a check box in the window colour darkened, invisible on the dark theme:
       an outline in the muted text colour, and checked filled with the accent. */
    QCheckBox::indicator {{ width: 13px; height: 13px; border: 1px solid {p.muted};
                            border-radius: 3px; background: {p.surface}; }}
    QCheckBox::indicator:checked {{ background: {p.accent}; border-color: {p.accent}; }}
    QCheckBox::indicator:disabled {{ border-color: {p.border}; }}
    QCheckBox::indicator:checked:disabled {{ background: {p.border}; }}
    /* Rounded spin boxes draw broken arrow buttons in Fusion: hide them (keys and the wheel
       still step the value). NoButtons would collapse the text field to 1 px instead. */
    QSpinBox::up-button, QSpinBox::down-button, QDoubleSpinBox::up-button,
    QDoubleSpinBox::down-button {{ width: 0px; border: none; }}
    QComboBox QAbstractItemView {{ border: 1px solid {p.border}; background: {p.surface};
                                   selection-background-color: {p.user_bubble};
                                   selection-color: {p.text}; }}
    QTabWidget::pane {{ border: 1px solid {p.border}; border-radius: 8px; top: -1px;
                        padding: 2px; }}
    QTabBar::tab {{ padding: 6px 14px; margin-right: 2px; color: {p.muted}; background: transparent;
                    border: none; border-bottom: 2px solid transparent; }}
    QTabBar::tab:selected {{ color: {p.text}; border-bottom-color: {p.accent}; }}
    QTabBar::tab:hover:!selected {{ color: {p.text}; }}
    QTabBar::tab:disabled {{ color: {p.border}; }}
    QProgressBar {{ border: none; background: {p.border}; border-radius: 3px; max-height: 6px; }}
    QProgressBar::chunk {{ background: {p.accent}; border-radius: 3px; }}
    /* A download's bar carries its text ("45% of 1.02 GiB"): tall enough for a line. */
    QAbstractItemView QProgressBar {{ max-height: 20px; min-height: 18px; margin: 2px 4px;
                                      text-align: center; color: {p.text}; }}
    QStatusBar {{ background: {p.sidebar}; border-top: 1px solid {p.border}; color: {p.muted}; }}
    QStatusBar QLabel {{ padding: 0 8px; color: {p.muted}; }}
    QDockWidget {{ font-weight: 600; }}
    #panel {{ background: {p.surface}; border: 1px solid {p.border}; border-radius: 8px; }}
    #panelTitle {{ font-weight: 600; }}
    #card {{ background: {p.surface}; border: 1px solid {p.border}; border-radius: 10px; }}
    QScrollBar:vertical {{ background: transparent; width: 10px; margin: 2px; }}
    QScrollBar::handle:vertical {{ background: {p.border}; border-radius: 4px; min-height: 30px; }}
    QScrollBar::add-line, QScrollBar::sub-line {{ height: 0; width: 0; }}
    """


def down_arrow(color: str, folder: Path | None = None) -> str:
    """A combo box's arrow, a 9×5 px triangle in `color`, as a PNG the style sheet can name:
    drawn once per colour into the cache folder (Qt style sheets take images only from files
    or resources, and a shipped file could not follow the theme's colours).

        down_arrow("#6b7280")  ->  '<cache>/theme/down-6b7280.png'
    """
    folder = folder or user_dirs().cache / "theme"
    path = folder / f"down-{color.lstrip('#').lower()}.png"
    if not path.is_file():
        scale = 4  # drawn large and scaled down: smooth edges at 1x and 2x screens
        image = QtGui.QImage(9 * scale, 5 * scale, QtGui.QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QtGui.QPainter(image)
        painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QtGui.QColor(color))
        painter.drawPolygon(QtGui.QPolygonF([QtCore.QPointF(0, 0), QtCore.QPointF(9 * scale, 0),
                                             QtCore.QPointF(4.5 * scale, 5 * scale)]))
        painter.end()
        data = QtCore.QByteArray()
        buffer = QtCore.QBuffer(data)
        buffer.open(QtCore.QIODevice.OpenModeFlag.WriteOnly)
        image.save(buffer, "PNG")  # type: ignore[call-overload]  # the stub wants bytes; PySide6 takes str
        buffer.close()
        folder.mkdir(parents=True, exist_ok=True)
        write_bytes(path, bytes(data.data()))
    return path.as_posix()


def apply_theme(app: QtWidgets.QApplication, palette: Palette) -> None:
    app.setStyle("Fusion")
    app.setPalette(qpalette(palette))
    app.setStyleSheet(style_sheet(palette))
